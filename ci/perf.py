"""The main job: benchmark HEAD with asv (the embedded CPU configuration where there is no GPU), fold the
per-sample JSONL into the samples sidecar, record into perf_history/ (no push unless --push), gate against
the previous recorded commit of this machine, print the report. Exit codes as the gate's.

`python -m ci perf [--no-record] [--results-dir perf_history] [--base SHA] [--bench-filter REGEX] [--push]`
With `--base-sha SHA --interleave N` (the GPU runner) base and head are run alternately N rounds each
(ABBA order) in git worktrees on the same GPU, so drift hits both equally.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ci import gate, history, record, report

ROOT = Path(__file__).resolve().parents[1]


def say(msg: str) -> None:
    print(f"[perf {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def machine_name() -> str:
    try:
        from kdengine.bench.fingerprint import machine_name as name
        return name()
    except (ImportError, AttributeError):
        import platform
        return f"cpu-{platform.machine() or 'unknown'}"


# --- asv -----------------------------------------------------------------------------------------------


def write_asv_config(tree: Path, results: Path, tmp: Path) -> Path:
    """asv.conf.json of `tree` with absolute paths and the results going to `results`."""
    conf_path = tree / "asv.conf.json"
    if not conf_path.exists():
        raise RuntimeError(f"{conf_path} is missing: the asv suites are not set up in this checkout")
    conf = json.loads(conf_path.read_text())
    conf.update(repo=str(tree), benchmark_dir=str(tree / conf.get("benchmark_dir", "benchmarks")),
                results_dir=str(results), html_dir=str(tmp / "html"), env_dir=str(tmp / "env"))
    out = tmp / f"asv-{results.name}.conf.json"
    out.write_text(json.dumps(conf, indent=1))
    return out


def run_asv(tree: Path, sha: str, machine: str, results: Path, tmp: Path, bench_filter: str | None,
            extra: list[str], verbose: bool = False) -> Path:
    """Run the suite of `tree` recorded as commit `sha`; returns the samples JSONL path."""
    conf = write_asv_config(tree, results, tmp)
    jsonl = results / f"samples-{sha[:12]}.jsonl"
    env = {**os.environ, "KDENGINE_SAMPLES_OUT": str(jsonl), "PYTHONPATH": f"{tree}{os.pathsep}"
           + os.environ.get("PYTHONPATH", "")}
    asv = [sys.executable, "-m", "asv"]
    subprocess.run([*asv, "machine", "--yes", "--machine", machine, "--config", str(conf)], env=env,
                   check=True, capture_output=True, text=True, cwd=tree)
    cmd = [*asv, "run", "--python=same", "--set-commit-hash", sha, "--machine", machine, "--config",
           str(conf), *(["--show-stderr"] if verbose else []), *(["--bench", bench_filter] if bench_filter else []), *extra]
    say("running: " + " ".join(cmd[2:]))
    proc = subprocess.run(cmd, env=env, cwd=tree)
    if proc.returncode != 0:
        say(f"asv run exited {proc.returncode} (failed benchmarks are recorded as missing)")
    return jsonl


def write_samples(jsonls: list[Path], sha: str, machine: str, results: Path) -> Path | None:
    """Fold the JSONL files into the sidecar (kdengine.bench.samples); None when nothing was recorded."""
    try:
        from kdengine.bench import samples
    except ImportError:
        say("kdengine.bench.samples is absent: no samples sidecar (the gate uses the history's spread)")
        return None
    merged = results / f"merged-{sha[:12]}.jsonl"
    merged.write_text("".join(p.read_text() for p in jsonls if p.exists()))
    if not merged.read_text().strip():
        say("no samples were written (KDENGINE_SAMPLES_OUT unused by the suites?)")
        return None
    return samples.write_sidecar(samples.collect_jsonl(merged, sha, machine), results)


# --- the job -------------------------------------------------------------------------------------------


def previous_base(results_dir: Path, machine: str, head: str, root: Path = ROOT) -> str | None:
    """The nearest first-parent ancestor of head that has results for this machine."""
    try:
        runs = history.load_all(results_dir, machine).get(machine, [])
    except history.DataError:
        raise
    have = {r.commit for r in runs}
    for sha in git("rev-list", "--first-parent", "--max-count=1000", head, cwd=root).split()[1:]:
        if sha in have:
            return sha
    return None


def measure(args, machine: str, head: str, tmp: Path, root: Path = ROOT) -> Path:
    """Run the suite(s) into tmp/new; returns that results directory (perf_history layout)."""
    new = tmp / "new"
    new.mkdir()
    extra = args.asv_arg or []
    if not args.interleave:
        jsonl = run_asv(root, head, machine, new, tmp, args.bench_filter, extra, args.verbose)
        write_samples([jsonl], head, machine, new)
        return new
    trees = {}
    for sha in (args.base_sha, head):
        tree = tmp / f"tree-{sha[:12]}"
        git("worktree", "add", "--detach", str(tree), sha, cwd=root)
        trees[sha] = tree
    jsonls: dict[str, list[Path]] = {sha: [] for sha in trees}
    try:
        for rnd in range(args.interleave):
            order = [args.base_sha, head] if rnd % 2 == 0 else [head, args.base_sha]
            for sha in order:
                say(f"round {rnd + 1}/{args.interleave}: {sha[:10]}")
                out = new / f".round{rnd}"
                out.mkdir(exist_ok=True)
                jsonls[sha].append(run_asv(trees[sha], sha, machine, out, tmp, args.bench_filter, extra,
                                            args.verbose))
        last = new / f".round{args.interleave - 1}"
        for path in last.rglob("*.json"):
            dest = new / path.relative_to(last)
            dest.parent.mkdir(parents=True, exist_ok=True)
            path.replace(dest)
        for sha, files in jsonls.items():
            write_samples(files, sha, machine, new)
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root, capture_output=True)
    for stale in new.glob(".round*"):
        shutil.rmtree(stale)
    return new


def drop_commit(results: Path, sha: str) -> Path:
    """A copy of a fresh results dir without commit `sha`'s files (asv result and sidecar)."""
    out = results.parent / "head-only"
    shutil.copytree(results, out)
    for path in list(out.rglob("*.json")):
        if path.name.startswith(sha[:8]) or path.stem == sha:
            path.unlink()
    return out


def perf(args) -> int:
    machine = args.machine or machine_name()
    root = Path(args.tree).resolve() if args.tree else ROOT
    head = git("rev-parse", "HEAD", cwd=root)
    results_dir = Path(args.results_dir)
    say(f"machine {machine}, head {head[:10]}, results {results_dir}")
    with tempfile.TemporaryDirectory(prefix="kdengine-perf-") as tmp_name:
        tmp = Path(tmp_name)
        new = measure(args, machine, head, tmp, root)
        gate_dir = results_dir
        if args.no_record or args.interleave:
            gate_dir = tmp / "merged"  # history + every fresh run (base too, when interleaved)
            if results_dir.exists():
                shutil.copytree(results_dir, gate_dir)
            record.install_results(new, gate_dir)
        if not args.no_record:
            keep = drop_commit(new, args.base_sha) if args.interleave else new  # record the head only
            out = record.record(keep, results_dir, root if args.commit else None, args.push, args.remote,
                                args.branch)
            say(f"recorded {len(out['written'])} files into {results_dir}"
                + (" and committed" if out["committed"] else ""))
        base = args.base or args.base_sha or previous_base(gate_dir, machine, head, root)
        if base is None:
            say("no earlier results for this machine: every benchmark is new (first run)")
            base = "0" * 40
        else:
            say(f"gating {head[:10]} against {base[:10]}")
        result = gate.run_gate(str(gate_dir), base, head, machine, repo=str(root),
                               pool=1 if args.interleave else None)
        report.write_outputs(result, args.json, args.markdown)
        print(report.render_markdown(result))
        return result["exit_code"]


def add_parser(sub) -> None:
    p = sub.add_parser("perf", help="the main job: benchmark HEAD, record, gate, report")
    p.add_argument("--results-dir", default="perf_history")
    p.add_argument("--no-record", action="store_true", help="gate without writing to perf_history")
    p.add_argument("--commit", action="store_true", help="commit the recorded results (gitpython)")
    p.add_argument("--push", action="store_true", help="commit and push with fetch-rebase-retry")
    p.add_argument("--remote", default="origin")
    p.add_argument("--branch", default="main")
    p.add_argument("--base", default=None, help="gate against this commit (default: previous recorded)")
    p.add_argument("--base-sha", default=None, help="with --interleave: the base commit to measure too")
    p.add_argument("--interleave", type=int, default=0, metavar="ROUNDS", help="ABBA rounds base/head")
    p.add_argument("--bench-filter", default=None, help="asv --bench regex")
    p.add_argument("--machine", default=None, help="machine name (default: from the fingerprint)")
    p.add_argument("--asv-arg", action="append", help="extra argument for `asv run` (repeatable)")
    p.add_argument("--tree", default=None, help="checkout to measure (default: this repository)")
    p.add_argument("--verbose", action="store_true", help="show the benchmarks' stderr (asv --show-stderr)")
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None)
    p.set_defaults(func=main)


def main(args) -> int:
    if args.interleave and not args.base_sha:
        raise ValueError("--base-sha: required with --interleave")
    args.commit = args.commit or args.push
    return perf(args)
