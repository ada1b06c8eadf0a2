"""A/A calibration: from repeated runs of one commit (several asv result files or sidecars of the same code),
measure each benchmark's run-to-run noise and widen its threshold in ci/thresholds.toml where the noise
demands it (threshold >= k x the relative spread of the run medians, and of the samples within a run).
Thresholds are only ever widened; the file is rewritten with its comment header for review.

`python -m ci calibrate --results-dir DIR --commits SHA[,SHA...] [--machine NAME] [--k 3] [--write]`
(A/A runs are usually recorded as distinct commit keys, e.g. with `asv run --set-commit-hash`.)
"""

from __future__ import annotations

import statistics
from pathlib import Path

from ci import gate, history

HEADER = """# Regression-gate thresholds: reviewed in pull requests like code.
# threshold = the smallest relative change (in the benchmark's bad direction) the gate may call a
# regression; alpha = significance level of the one-sided Mann-Whitney U test.
# [thresholds] keys are workload names or glob patterns (fnmatch); the most specific match wins.
# `python -m ci calibrate` widens entries from A/A runs; it never narrows them.
"""


def relative_spread(values: list[float]) -> float:
    """Robust relative spread: 1.4826 * MAD / median (0 for fewer than 2 values)."""
    if len(values) < 2:
        return 0.0
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return 1.4826 * mad / abs(med) if med else 0.0


def measure_noise(runs: list[history.Run]) -> dict[str, float]:
    """{workload: noise}: the larger of the spread of run medians and the median within-run spread."""
    names = sorted({n for r in runs for n in r.points})
    noise = {}
    for name in names:
        pts = [r.points[name] for r in runs if name in r.points]
        between = relative_spread([p.value for p in pts])
        within = statistics.median([relative_spread(p.samples) for p in pts if p.samples] or [0.0])
        noise[name] = max(between, within)
    return noise


def widen(config: dict, noise: dict[str, float], k: float) -> dict[str, tuple[float, float]]:
    """{workload: (old, new)} for every benchmark whose threshold must grow to k x its noise."""
    changes = {}
    for name, n in noise.items():
        old = gate.threshold_for(name, config)
        need = round(k * n + 0.005, 2)
        if need > old:
            changes[name] = (old, need)
    return changes


def format_toml(config: dict) -> str:
    lines = [HEADER, "[defaults]"]
    for key in ("threshold", "alpha"):
        lines.append(f"{key} = {config['defaults'][key]}")
    lines += ["", "[thresholds]"]
    lines += [f'"{name}" = {value}' for name, value in sorted(config["thresholds"].items())]
    return "\n".join(lines) + "\n"


def write_thresholds(config: dict, path: Path) -> None:
    import os
    import tempfile

    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".thresholds.")
    with os.fdopen(fd, "w") as fh:
        fh.write(format_toml(config))
    os.replace(tmp, path)


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="A/A noise per benchmark; widen thresholds for review")
    p.add_argument("--results-dir", default="perf_history")
    p.add_argument("--commits", required=True, help="comma-separated commit keys of the A/A runs (>= 2)")
    p.add_argument("--machine", default=None)
    p.add_argument("--k", type=float, default=3.0, help="threshold >= k x noise (default 3)")
    p.add_argument("--thresholds", default=str(gate.THRESHOLDS_FILE))
    p.add_argument("--write", action="store_true", help="rewrite the thresholds file (else dry run)")
    p.set_defaults(func=main)


def main(args) -> int:
    shas = [s for s in args.commits.split(",") if s]
    if len(shas) < 2:
        raise ValueError(f"--commits: expected at least 2 A/A runs, got {len(shas)}")
    config = gate.load_thresholds(args.thresholds)
    for machine, runs in history.load_all(args.results_dir, args.machine).items():
        picked = [r for r in (history.find_run(runs, s) for s in shas) if r is not None]
        if len(picked) < 2:
            continue
        noise = measure_noise(picked)
        changes = widen(config, noise, args.k)
        for name, n in sorted(noise.items()):
            old, new = changes.get(name, (gate.threshold_for(name, config), None))
            note = f"widen {old:.0%} -> {new:.0%}" if new else f"keep {old:.0%}"
            print(f"[calibrate] {machine} {name}: noise {n:.2%} over {len(picked)} runs: {note}")
        config["thresholds"].update({name: new for name, (_, new) in changes.items()})
    if args.write:
        write_thresholds(config, Path(args.thresholds))
        print(f"[calibrate] wrote {args.thresholds}: review the diff before committing")
    return 0
