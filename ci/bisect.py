"""Find the commit that slowed one benchmark: measure the good commit's distribution, then drive
`git bisect run` (in a temporary worktree, so the caller's checkout is untouched) with a step that builds,
runs the benchmark --runs times interleaved with the good commit (a second worktree: drift hits both) and
calls the commit bad when the gate's own rule (ci.noise.decide: beyond the run-to-run noise and past the
benchmark's floor) says regressed. Prints the culprit and how many benchmark runs it took.

`python -m ci bisect --good SHA --bad SHA --benchmark NAME [--runs N] [--cmd CMD] [--build CMD]`
--cmd is a shell command run in the checkout under test that prints the benchmark's value(s) (one float a
line); by default the checkout's asv suite runs through `python -m ci perf --no-record` (narrow it with
--asv-filter) and NAME's median is printed.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ci import gate

ROOT = Path(__file__).resolve().parents[1]
FLOAT = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def default_cmd(benchmark: str, asv_filter: str | None) -> str:
    """This repository's `ci perf --no-record --tree .` on the checkout under test; prints NAME's median."""
    argv = ["perf", "--no-record", "--tree", ".", "--results-dir", ".bisect-empty", "--json", ".bisect.json"]
    argv += ["--bench-filter", asv_filter] if asv_filter else []
    run = (f"import sys; sys.path.insert(0, {str(ROOT)!r}); from ci.__main__ import main; "
           f"main({argv!r})")
    pick = (f"import json; d = json.load(open('.bisect.json')); "
            f"[print(b['head']) for b in d['benchmarks'] if b['name'] == {benchmark!r}]")
    py = shlex.quote(sys.executable)
    return f"{py} -c {shlex.quote(run)} >/dev/null; {py} -c {shlex.quote(pick)}"


def measure(tree: Path, cmd: str, runs: int, build: str | None) -> list[float] | None:
    """runs x cmd in tree -> every float printed; None when the build fails (bisect skips it)."""
    # the checkout under test first; this repository's ci package as a fallback for old commits
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(ROOT), os.environ.get("PYTHONPATH", "")])}
    if build and subprocess.run(build, shell=True, cwd=tree, env=env).returncode != 0:
        return None
    values: list[float] = []
    for _ in range(runs):
        proc = subprocess.run(cmd, shell=True, cwd=tree, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            return None
        values += [float(x) for x in FLOAT.findall(proc.stdout)]
    return values


def is_bad(good: list[float], values: list[float], direction: str, threshold: float,
           alpha: float) -> tuple[bool, float, str]:
    """(bad?, relative worsening, the decision's reason): the gate's own rule (ci.noise.decide), each
    value one run of the good or the candidate commit, the spread estimated from both sides' runs."""
    from ci import noise

    est = noise.rounds_estimate(good, values, direction)
    decision = noise.decide(est, threshold, alpha)
    return decision.verdict == "regressed", est.worse, decision.verdict


def measure_interleaved(tree: Path, good_tree: Path, cmd: str, runs: int) -> tuple[list, list] | None:
    """runs rounds of (good, candidate), alternating, so machine drift hits both sides alike."""
    good, cand = [], []
    for _ in range(runs):
        g, c = measure(good_tree, cmd, 1, None), measure(tree, cmd, 1, None)
        if not g or not c:
            return None
        good += g
        cand += c
    return good, cand


def step(state_path: Path) -> int:
    """One `git bisect run` step: exit 0 good, 1 bad, 125 skip (build or run failed)."""
    state = json.loads(state_path.read_text())
    tree = Path.cwd()
    if state["build"] and measure(tree, "true", 1, state["build"]) is None:
        return 125
    good, values = [], []
    for attempt in range(3):  # ambiguous (not significant but worse than half the threshold): measure more
        got = measure_interleaved(tree, Path(state["good_tree"]), state["cmd"], state["runs"])
        state["runs_done"] += 2 * state["runs"]
        state_path.write_text(json.dumps(state))
        if not got:
            return 125
        good, values = good + got[0], values + got[1]
        bad, worse, verdict = is_bad(good, values, state["direction"], state["threshold"], state["alpha"])
        if verdict != "noisy":
            break
        print(f"[bisect] ambiguous ({worse:+.1%} worse, {verdict}): measuring again ({attempt + 2}/3)")
    sha = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    print(f"[bisect] {sha}: median {statistics.median(values):.4g} vs good {statistics.median(good):.4g}"
          f" ({worse:+.1%} worse, {verdict}) -> {'bad' if bad else 'good'}", flush=True)
    return 1 if bad else 0


def git(repo: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=check)


def bisect(repo: Path, good: str, bad: str, benchmark: str, runs: int, cmd: str | None, build: str | None,
           direction: str, threshold: float | None, alpha: float, asv_filter: str | None = None) -> dict:
    config = gate.load_thresholds()
    thr = threshold if threshold is not None else gate.threshold_for(benchmark, config)
    cmd = cmd or default_cmd(benchmark, asv_filter)
    good, bad = (git(repo, "rev-parse", "--verify", f"{ref}^{{commit}}").stdout.strip() for ref in (good, bad))
    with tempfile.TemporaryDirectory(prefix="kdengine-bisect-") as tmp_name:
        tmp = Path(tmp_name)
        tree, good_tree = tmp / "tree", tmp / "good"
        git(repo, "worktree", "add", "--detach", str(tree), good)
        git(repo, "worktree", "add", "--detach", str(good_tree), good)
        try:
            if build and measure(good_tree, "true", 1, build) is None:
                raise RuntimeError(f"--build: the build failed at the good commit {good}")
            got = measure_interleaved(tree, good_tree, cmd, runs)
            if not got:
                raise RuntimeError(f"--good: the benchmark did not run at {good} (cmd: {cmd})")
            state_path = tmp / "state.json"
            state_path.write_text(json.dumps({"good_tree": str(good_tree), "cmd": cmd, "runs": runs,
                                              "build": build, "direction": direction, "threshold": thr,
                                              "alpha": alpha, "runs_done": 2 * runs}))
            git(tree, "bisect", "start", bad, good)
            step_cmd = [sys.executable, "-c", "import sys; from ci.bisect import step; "
                        f"sys.exit(step(__import__('pathlib').Path({str(state_path)!r})))"]
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            proc = subprocess.run(["git", "bisect", "run", *step_cmd], cwd=tree, env=env,
                                  capture_output=True, text=True)
            print(proc.stdout[-4000:].rstrip())
            found = re.search(r"([0-9a-f]{40}) is the first bad commit", proc.stdout)
            git(tree, "bisect", "reset", check=False)
            state = json.loads(state_path.read_text())
        finally:
            for t in (tree, good_tree):
                git(repo, "worktree", "remove", "--force", str(t), check=False)
    if not found:
        raise RuntimeError(f"git bisect did not name a culprit: {proc.stdout[-400:]}{proc.stderr[-400:]}")
    subject = git(repo, "log", "-1", "--format=%s", found.group(1)).stdout.strip()
    return {"culprit": found.group(1), "subject": subject, "runs": state["runs_done"], "threshold": thr}


def add_parser(sub) -> None:
    p = sub.add_parser("bisect", help="git bisect run over one benchmark between good and bad")
    p.add_argument("--good", required=True)
    p.add_argument("--bad", required=True)
    p.add_argument("--benchmark", required=True, help="workload name (threshold lookup, default cmd)")
    p.add_argument("--runs", type=int, default=5, help="benchmark runs per bisect step (default 5)")
    p.add_argument("--cmd", default=None, help="shell command printing the benchmark value(s)")
    p.add_argument("--build", default=None, help="shell command to build each checkout (e.g. kdengine build)")
    p.add_argument("--direction", choices=("lower", "higher"), default="lower")
    p.add_argument("--threshold", type=float, default=None, help="default: from ci/thresholds.toml")
    p.add_argument("--alpha", type=float, default=0.001, help="false-alarm rate per step (default 0.001)")
    p.add_argument("--asv-filter", default=None, help="asv --bench regex for the default cmd")
    p.add_argument("--repo", default=".")
    p.set_defaults(func=main)


def main(args) -> int:
    if args.runs < 1:
        raise ValueError(f"--runs: expected >= 1, got {args.runs}")
    out = bisect(Path(args.repo), args.good, args.bad, args.benchmark, args.runs, args.cmd, args.build,
                 args.direction, args.threshold, args.alpha, args.asv_filter)
    print(f"[bisect] culprit: {out['culprit']} {out['subject']}")
    print(f"[bisect] benchmark runs: {out['runs']} (threshold {out['threshold']:.0%})")
    return 0
