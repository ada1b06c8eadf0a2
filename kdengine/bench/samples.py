"""Per-sample values on their way to perf_history/samples/<machine>/<sha>-<run_id>.json (perf_history/README.md).

While asv (or `kdengine bench`) runs, each measured workload appends one JSON line to the file named
by KDENGINE_SAMPLES_OUT (`append_record`). After the run, the CI calls `collect_jsonl(path, commit,
machine, env=...)` to fold those lines into one sidecar dict and `write_sidecar(data, perf_history_dir)` to
store it atomically. Every run has its own id, so two runs of one commit on one machine (a rerun, an A/A
pair, two runners) are two files, never one replacing the other. Schema 1 files (`<sha>.json`, no run id)
are still read.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import secrets
import tempfile
from pathlib import Path

from kdengine import env
from kdengine.bench import fingerprint, metrics, names

SCHEMA = 2
READABLE_SCHEMAS = (1, 2)
RESULT_FIELDS = ("asv_name", "asv_params", "unit", "direction", "median", "samples", "throttled", "extra")
DIRECTIONS = ("lower", "higher")
RUN_ID = re.compile(r"^[0-9]{8}T[0-9]{6}Z-[0-9a-f]{6}$")


def new_run_id() -> str:
    """A unique id for one run: UTC time it was made + 6 random hex digits (sorts by time)."""
    return dt.datetime.now(dt.timezone.utc).strftime("%Y%m%dT%H%M%SZ") + "-" + secrets.token_hex(3)


def make_record(*, name: str, unit: str, direction: str, median: float, samples: list[float],
                throttled: bool, fingerprint: dict, asv_name: str | None = None,
                asv_params: list[str] | None = None, extra: dict | None = None, run: str | None = None) -> dict:
    """One JSONL line: a workload's result plus the fingerprint it was measured under."""
    names.check_workload_name(name, "name")
    if direction not in DIRECTIONS:
        raise ValueError(f"direction: expected one of {DIRECTIONS}, got {direction!r}")
    metrics.check_entry(asv_name, unit, direction, f"record {name}")
    if not samples:
        raise ValueError(f"samples: expected at least one value for {name}, got none")
    for value in [median, *samples]:
        metrics.check_value(value, unit, f"record {name}")
    return {
        "name": name, "asv_name": asv_name, "asv_params": list(asv_params or []), "unit": unit,
        "direction": direction, "median": float(median), "samples": [float(s) for s in samples],
        "throttled": bool(throttled), "extra": dict(extra or {}), "fingerprint": dict(fingerprint),
        "run": run,
    }


def append_record(record: dict, path: Path | str | None = None) -> Path | None:
    """Append one line to `path` (default: KDENGINE_SAMPLES_OUT); no-op when neither is set."""
    path = Path(path) if path is not None else env.samples_out()
    if path is None:
        return None
    path.parent.mkdir(parents=True, exist_ok=True)
    line = json.dumps(record, sort_keys=True) + "\n"
    with open(path, "a", encoding="utf-8") as fh:  # one write per record: lines never interleave
        fh.write(line)
    return path


def read_jsonl(path: Path | str) -> list[dict]:
    """All records of a JSONL file ([] if it does not exist); a malformed line raises ValueError."""
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if line.strip():
            try:
                records.append(json.loads(line))
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: expected a JSON record, got {line[:80]!r} ({exc})") from None
    return records


def find_record(name: str, run: str, path: Path | str | None = None) -> dict | None:
    """The last record of workload `name` written by run `run` to the JSONL file, if any."""
    path = Path(path) if path is not None else env.samples_out()
    if path is None:
        return None
    found = None
    for record in read_jsonl(path):
        if record.get("name") == name and record.get("run") == run:
            found = record
    return found


def _merge_fingerprints(records: list[dict]) -> dict:
    """The run's fingerprint: the first record's, with clocks from the first and last records and
    throttled set when any record throttled."""
    if not records:
        return {}
    first, last = records[0].get("fingerprint", {}), records[-1].get("fingerprint", {})
    merged = dict(first)
    merged["clocks_start"] = first.get("clocks_start", {})
    merged["clocks_end"] = last.get("clocks_end", {})
    merged["throttled"] = any(_record_throttled(r) for r in records)
    return merged


def _record_throttled(record: dict) -> bool:
    """A record's throttle verdict, re-derived from its raw clock readings where it has them (so a rule
    fixed later applies to old raw data), else the flags it was written with."""
    fp = record.get("fingerprint", {})
    start, end = fp.get("clocks_start"), fp.get("clocks_end")
    if start or end:
        return fingerprint.throttled(start or {}, end or {})
    return bool(record.get("throttled") or fp.get("throttled"))


def collect_jsonl(jsonl_path: Path | str, commit: str, machine: str, env: str | None = None,
                  run_id: str | None = None, branch: str | None = None) -> dict:
    """The sidecar dict (schema 2) of one run: one entry per workload, the last record winning.
    env: the environment the run used (asv's env_name), part of the run's identity; run_id: default new;
    branch: the tracked branch (asv.conf.json "branches") whose history held the commit when it was measured, None
    when none did (a side branch, an empty commit of a gate check) or it was not known."""
    if not commit or not isinstance(commit, str):
        raise ValueError(f"commit: expected a commit sha, got {commit!r}")
    names.check_machine_name(machine, "machine")
    records = read_jsonl(jsonl_path)
    results = {}
    for record in records:
        results[record["name"]] = {k: record.get(k) for k in RESULT_FIELDS}
        results[record["name"]]["throttled"] = _record_throttled(record)
    run_id = run_id or new_run_id()
    if not RUN_ID.match(run_id):
        raise ValueError(f"run_id: expected YYYYMMDDTHHMMSSZ-xxxxxx, got {run_id!r}")
    return {
        "schema": SCHEMA,
        "commit": commit,
        "machine": machine,
        "run_id": run_id,
        "env": env,
        "branch": branch,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "fingerprint": {**_merge_fingerprints(records), "commit": commit},
        "results": dict(sorted(results.items())),
    }


def sidecar_path(perf_history_dir: Path | str, machine: str, commit: str, run_id: str | None = None) -> Path:
    """samples/<machine>/<commit>-<run_id>.json (schema 2), or <commit>.json for a schema 1 file."""
    stem = f"{commit}-{run_id}" if run_id else commit
    return Path(perf_history_dir) / "samples" / machine / f"{stem}.json"


def check_sidecar(data: object, where: str) -> dict:
    """The sidecar dict if it has a readable schema and its required keys; ValueError naming `where`."""
    if not isinstance(data, dict):
        raise ValueError(f"{where}: expected a JSON object, got {type(data).__name__}")
    for key in ("schema", "commit", "machine", "results"):
        if key not in data:
            raise ValueError(f"{where}: missing key {key!r} (keys: {sorted(data)})")
    if data["schema"] not in READABLE_SCHEMAS:
        raise ValueError(f"{where}: samples schema {data['schema']!r} is not one this version reads "
                         f"{READABLE_SCHEMAS}")
    if data["schema"] >= 2 and not RUN_ID.match(str(data.get("run_id"))):
        raise ValueError(f"{where}: schema 2 needs a run_id like 20261130T120000Z-0a1b2c, got "
                         f"{data.get('run_id')!r}")
    if not isinstance(data["results"], dict):
        raise ValueError(f"{where}: 'results' must be an object")
    return data


def write_sidecar(data: dict, perf_history_dir: Path | str) -> Path:
    """Write `data` to perf_history/samples/<machine>/<commit>-<run_id>.json atomically and exclusively (an
    existing file of that run is an error, never replaced); return the path."""
    check_sidecar(data, "data")
    if data["schema"] != SCHEMA:
        raise ValueError(f"data['schema']: expected {SCHEMA}, got {data['schema']!r}")
    path = sidecar_path(perf_history_dir, data["machine"], data["commit"], data["run_id"])
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(data, fh, indent=1, sort_keys=True, allow_nan=False)
            fh.write("\n")
        os.link(tmp, path)  # fails when the file exists: a run is written once
    except FileExistsError:
        raise ValueError(f"{path} exists: run {data['run_id']} was already written") from None
    finally:
        Path(tmp).unlink(missing_ok=True)
    return path


def run_to_run_spread(first: Path | str, second: Path | str) -> dict[str, dict]:
    """Per workload in both JSONL runs: the two medians, their relative difference (second vs first,
    signed) and each run's interquartile range relative to its median: the noise a gate must beat."""

    def by_name(path):
        return {r["name"]: r for r in read_jsonl(path)}

    def rel_iqr(values: list[float]) -> float:
        import statistics

        q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
        return (q[2] - q[0]) / statistics.median(values)

    a, b = by_name(first), by_name(second)
    return {
        name: {"median_1": a[name]["median"], "median_2": b[name]["median"],
               "rel_diff": (b[name]["median"] - a[name]["median"]) / a[name]["median"],
               "rel_iqr_1": rel_iqr(a[name]["samples"]), "rel_iqr_2": rel_iqr(b[name]["samples"]),
               "unit": a[name]["unit"]}
        for name in sorted(a.keys() & b.keys())
    }
