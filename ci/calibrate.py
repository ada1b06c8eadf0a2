"""A/A calibration: from repeated runs of unchanged code on one machine (several runs of one commit, or
runs of commits that changed nothing measured), measure each benchmark's run-to-run spread and write it as
the machine's prior in ci/noise_prior.toml, the gate's fallback while a benchmark's history is short.

`python -m ci calibrate --results-dir DIR --commits SHA[,SHA...] [--machine NAME] [--write]`
Prints, per benchmark, the within-run spread (samples), the run-to-run spread (run medians) and their
ratio: a ratio far above 1 is a benchmark whose samples cannot judge a rerun (the eager reference).
The file is rewritten for review (a pull request), never silently.
"""

from __future__ import annotations

import math
import os
import statistics
import tempfile
from pathlib import Path

from ci import gate, history, noise

HEADER = """# Run-to-run noise priors per machine: reviewed in pull requests like code (`python -m ci calibrate` writes
# them from A/A runs: several runs of unchanged code on one machine).
# [machines."<machine glob>"] "<benchmark glob>" = {sigma = <relative sd of run medians>, runs = <weight>}
# sigma is the spread a rerun of the same code shows (log scale, 0.01 = 1%); runs is how many runs' worth
# of evidence the prior carries against the history's own runs. The gate uses the prior while a benchmark's
# history is short; without one, a change past the floor on a short history is "noisy: needs confirmation".
"""
MIN_SIGMA = 1e-4  # a prior of exactly 0 would make any difference significant


def measure_noise(runs: list[history.Run]) -> dict[str, dict]:
    """{workload: {"sigma", "runs", "within"}} over runs of unchanged code (>= 2 runs of a workload)."""
    out = {}
    for name in sorted({n for r in runs for n in r.points}):
        pts = [r.points[name] for r in runs if name in r.points and r.points[name].direction != "info"]
        if len(pts) < 2:
            continue
        logs = [math.log(p.value) for p in pts]
        sigma = max(statistics.stdev(logs), MIN_SIGMA)
        within = statistics.median([noise.within_run_sd(p.samples) for p in pts])
        out[name] = {"sigma": sigma, "runs": len(pts) - 1, "within": within}
    return out


def format_toml(priors: dict[str, dict[str, dict]]) -> str:
    lines = [HEADER]
    for machine in sorted(priors):
        lines.append(f'[machines."{machine}"]')
        for name, p in sorted(priors[machine].items()):
            lines.append(f'"{name}" = {{sigma = {p["sigma"]:.3g}, runs = {p["runs"]:g}}}')
        lines.append("")
    return "\n".join(lines)


def write_atomic(text: str, path: Path) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as fh:
        fh.write(text)
    os.replace(tmp, path)


def add_parser(sub) -> None:
    p = sub.add_parser("calibrate", help="A/A runs -> run-to-run noise priors per benchmark, for review",
                       description=__doc__)
    p.add_argument("--results-dir", default="perf_history")
    p.add_argument("--commits", required=True, help="comma-separated commits whose runs are A/A (>= 2 runs)")
    p.add_argument("--machine", default=None)
    p.add_argument("--priors", default=str(gate.PRIOR_FILE), help="priors TOML (default ci/noise_prior.toml)")
    p.add_argument("--write", action="store_true", help="rewrite the priors file (else dry run)")
    p.set_defaults(func=main)


def main(args) -> int:
    shas = [s for s in args.commits.split(",") if s.strip()]
    if not shas:
        raise ValueError("--commits: expected at least one commit")
    existing = gate.load_toml(Path(args.priors)).get("machines", {})
    priors = {m: dict(t) for m, t in existing.items()}
    found = 0
    for machine, runs in history.load_all(args.results_dir, args.machine).items():
        commits = {history.resolve_commit([r.commit for r in runs], s, "--commits") for s in shas
                   if any(r.commit.startswith(s) for r in runs)}
        picked = [r for r in runs if r.commit in commits and not r.throttled]
        if len(picked) < 2:
            continue
        found += 1
        measured = measure_noise(picked)
        for name, n in measured.items():
            ratio = n["sigma"] / n["within"] if n["within"] else math.inf
            print(f"[calibrate] {machine} {name}: run-to-run {n['sigma']:.2%} over {n['runs'] + 1} runs, "
                  f"within-run {n['within']:.2%} (ratio {ratio:.1f})")
        priors.setdefault(machine, {}).update({k: {"sigma": v["sigma"], "runs": v["runs"]}
                                               for k, v in measured.items()})
    if not found:
        raise ValueError(f"--commits: no machine in {args.results_dir} has >= 2 runs of {args.commits}")
    if args.write:
        write_atomic(format_toml(priors), Path(args.priors))
        print(f"[calibrate] wrote {args.priors}: review the diff before committing")
    return 0
