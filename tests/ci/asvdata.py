"""Write asv-format result directories (v2 result files, machine.json, benchmarks.json) and samples
sidecars for the ci tests: the fixtures under tests/ci/fixtures were made with these, and the synthetic
histories are built with them on the fly."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

COLUMNS = ["result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
           "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples", "profile"]
FINGERPRINT = {"gpu": "NVIDIA H200", "sm_count": 132, "driver": "580.1", "cuda": "13.0", "torch": "2.11.0",
               "triton": "3.6.0", "throttled": False, "dirty": False}
BENCHMARKS = {
    "bench_verify.Verify.track_time": {
        "name": "bench_verify.Verify.track_time", "unit": "seconds", "type": "track", "version": "v1",
        "param_names": ["backend", "ctx", "T"],
        "params": [["'triton'", "'triton_extend'", "'cuda'"], ["4096", "16384", "65536"], ["16"]]},
    "bench_decode.Decode.track_tok_per_s": {
        "name": "bench_decode.Decode.track_tok_per_s", "unit": "tok/s", "type": "track", "version": "v1",
        "param_names": ["ctx"], "params": [["4096", "16384"]]},
}


def write_benchmarks(results_dir: Path) -> None:
    results_dir.mkdir(parents=True, exist_ok=True)
    (results_dir / "benchmarks.json").write_text(json.dumps({**BENCHMARKS, "version": 2}, indent=1))


def write_machine(results_dir: Path, machine: str) -> None:
    d = results_dir / machine
    d.mkdir(parents=True, exist_ok=True)
    (d / "machine.json").write_text(json.dumps({"machine": machine, "arch": "x86_64", "cpu": "test",
                                                "os": "Linux", "num_cpu": "2", "ram": "1", "version": 1}))


def write_run(results_dir: Path, machine: str, commit: str, date_ms: int, values: dict[str, list[float]],
              sidecar: bool = True, fingerprint: dict | None = None, throttled: bool = False) -> None:
    """values: {workload: samples}; workloads 'verify/<backend>/ctx<N>/T<T>' (seconds) and
    'decode/<backend>/ctx<N>' (tok/s) map to the two asv benchmarks above."""
    write_machine(results_dir, machine)
    grids: dict[str, dict[tuple, tuple[float, list[float]]]] = {}
    side = {}
    for workload, samples in values.items():
        parts = workload.split("/")
        if parts[0] == "verify":
            name, params = "bench_verify.Verify.track_time", [f"'{parts[1]}'", parts[2][3:], parts[3][1:]]
            unit, direction = "seconds", "lower"
        else:
            name, params = "bench_decode.Decode.track_tok_per_s", [parts[2][3:]]
            unit, direction = "tok/s", "higher"
        med = statistics.median(samples)
        grids.setdefault(name, {})[tuple(params)] = (med, list(samples))
        side[workload] = {"asv_name": name, "asv_params": params, "unit": unit, "direction": direction,
                          "median": med, "samples": list(samples), "throttled": throttled,
                          "extra": {"nsplit": 64}}
    data = {"commit_hash": commit, "env_name": "existing-py", "date": date_ms,
            "params": {"machine": machine, "arch": "x86_64", "cpu": "test", "python": "3.11"},
            "python": "3.11", "requirements": {}, "env_vars": {}, "result_columns": COLUMNS,
            "results": {name: _asv_row(grid) for name, grid in grids.items()}, "durations": {}, "version": 2}
    (results_dir / machine / f"{commit[:8]}-existing-py.json").write_text(json.dumps(data))
    if sidecar:
        d = results_dir / "samples" / machine
        d.mkdir(parents=True, exist_ok=True)
        fp = {**FINGERPRINT, **(fingerprint or {}), "commit": commit, "throttled": throttled}
        (d / f"{commit}.json").write_text(json.dumps({
            "schema": 1, "commit": commit, "machine": machine, "date": "2026-01-01T00:00:00Z",
            "fingerprint": fp, "results": side}))


def _asv_row(grid: dict[tuple, tuple[float, list[float]]]) -> list:
    """asv's product layout: one result per combination of the param lists, null where not measured."""
    import itertools

    nparams = len(next(iter(grid)))
    lists = [list(dict.fromkeys(c[i] for c in grid)) for i in range(nparams)]
    combos = list(itertools.product(*lists))
    result = [grid[c][0] if c in grid else None for c in combos]
    samples = [grid[c][1] if c in grid else None for c in combos]
    return [result, lists, "v1", None, None, None, None, None, None, None, None, samples]
