"""The main job: benchmark HEAD once with asv (the embedded CPU configuration where there is no GPU), judge it
against the recorded history of this machine (ci/gate.py), re-measure only the suspects with base and
head interleaved on the same machine (confirmation), print and write the verdict, and only then record
into perf_history/ (and push with --push). Exit codes as the gate's: 1 only on a confirmed regression.

While the suspects are re-measured, --json / --markdown already hold the first pass, marked undecided ("pending"), so
that a job killed then leaves its measurements and suspects behind. SIGTERM or Ctrl-C during confirmation stops it
after the rounds done so far: the report is judged from them, says it was interrupted and is undecided (exit_code
null) unless a regression was already confirmed; nothing is recorded (a rerun judges the commit again), and the exit
is 128 + the signal (1 if a regression was already confirmed).

`python -m ci perf [--no-record] [--base SHA | --base-sha SHA] [--bench-filter REGEX] [--confirm-budget S]`
A rerun of a commit that already has results is judged against its earlier run (an A/A pair).
"""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from ci import gate, history, record, report
from kdengine.bench import names

ROOT = Path(__file__).resolve().parents[1]
MIN_ROUNDS = 2  # a confirmation needs two runs a side to know its own spread, whatever the budget
PROGRESS = re.compile(r"^\s*\[\s*\d+(\.\d+)?%\]")


class Interrupted(BaseException):
    """SIGTERM during confirmation (raised by the handler perf() installs; Ctrl-C is KeyboardInterrupt)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def stop_signal(e: BaseException) -> int:
    """The signal behind an Interrupted or a KeyboardInterrupt (SIGINT)."""
    return e.signum if isinstance(e, Interrupted) else signal.SIGINT


def _interrupt(signum, _frame):
    # once: a second SIGTERM (a process-group signal and a forwarded one arrive together) must not cut the report
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    raise Interrupted(signum)


def say(msg: str) -> None:
    print(f"[perf {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def git(*args: str, cwd: Path = ROOT) -> str:
    return subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def machine_name() -> str:
    from kdengine.bench.fingerprint import machine_name as name

    return name()


# --- asv -----------------------------------------------------------------------------------------------


def write_asv_config(bench_tree: Path, code_tree: Path, results: Path, tmp: Path) -> Path:
    """asv.conf.json of `bench_tree` with absolute paths, the code of `code_tree`, results into `results`."""
    conf_path = bench_tree / "asv.conf.json"
    if not conf_path.exists():
        raise RuntimeError(f"{conf_path} is missing: the asv suites are not set up in this checkout")
    conf = json.loads(conf_path.read_text())
    conf.update(repo=str(code_tree), benchmark_dir=str(bench_tree / conf.get("benchmark_dir", "benchmarks")),
                results_dir=str(results), html_dir=str(tmp / "html"), env_dir=str(tmp / "env"))
    out = tmp / f"asv-{results.name}-{code_tree.name}.conf.json"
    out.write_text(json.dumps(conf, indent=1))
    return out


def run_asv(code_tree: Path, sha: str, machine: str, results: Path, tmp: Path, bench: list[str],
            extra: list[str], verbose: bool = False, bench_tree: Path | None = None) -> Path:
    """Run the suite of `bench_tree` (default: code_tree) over the code of `code_tree`, recorded as commit
    `sha` (asv's model: one suite, many commits); returns the samples JSONL path. The console shows one
    line per benchmark; asv's full output goes to a log file next to the results."""
    bench_tree = bench_tree or code_tree
    results.mkdir(parents=True, exist_ok=True)
    conf = write_asv_config(bench_tree, code_tree, results, tmp)
    jsonl = results / f"samples-{sha[:12]}.jsonl"
    pythonpath = os.pathsep.join([str(code_tree), str(bench_tree), os.environ.get("PYTHONPATH", "")])
    env = {**os.environ, "KDENGINE_SAMPLES_OUT": str(jsonl), "PYTHONPATH": pythonpath,
           "ASV_PYTHONPATH": pythonpath}
    asv = [sys.executable, "-m", "asv"]
    subprocess.run([*asv, "machine", "--yes", "--machine", machine, "--config", str(conf)], env=env,
                   check=True, capture_output=True, text=True, cwd=bench_tree)
    cmd = [*asv, "run", "--python=same", "--set-commit-hash", sha, "--machine", machine, "--config",
           str(conf), "--show-stderr", *[a for b in bench for a in ("--bench", b)], *extra]
    log = results / f"asv-{sha[:12]}.log"
    say("running: asv run --set-commit-hash " + sha[:10] + (f" ({len(bench)} filters)" if bench else "")
        + f"; log {log}")
    with open(log, "w", encoding="utf-8") as fh:
        # its own process group: interrupted here (SIGTERM, Ctrl-C), asv and its benchmark processes are stopped
        proc = subprocess.Popen(cmd, env=env, cwd=bench_tree, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, start_new_session=True)
        try:
            for line in proc.stdout:  # type: ignore[union-attr]
                fh.write(line)
                if verbose or (PROGRESS.match(line) and "n/a" not in line) or "Traceback" in line:
                    print("  " + line.rstrip()[:160], flush=True)
            proc.wait()
        except BaseException:
            stop_group(proc)
            raise
    if proc.returncode != 0:
        tail = log.read_text(encoding="utf-8", errors="replace").splitlines()[-15:]
        say(f"asv run exited {proc.returncode} (failed benchmarks are recorded as missing); the end of {log}:")
        print("\n".join("  | " + line[:200] for line in tail), flush=True)
    return jsonl


def session_groups(sid: int) -> set[int] | None:
    """The process groups with a running member (zombies, which nothing may reap in a container, do not count) in
    session `sid`; None without /proc."""
    stats = list(Path("/proc").glob("[0-9]*/stat"))
    if not stats:
        return None
    groups = set()
    for stat in stats:
        try:
            state, _ppid, pgrp, session = stat.read_text().rsplit(")", 1)[1].split()[:4]
        except (OSError, ValueError):
            continue
        if state != "Z" and int(session) == sid:
            groups.add(int(pgrp))
    return groups


def stop_group(proc: subprocess.Popen, grace: float = 10.0) -> None:
    """SIGTERM to every process group of proc's session (proc started with start_new_session), SIGKILL after `grace`
    seconds to what is left. The session, not only proc's group: asv starts its benchmark server in a process group
    of its own (setpgid), which outlived asv when only asv's group was signalled. Without /proc: proc's group."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        groups = session_groups(proc.pid)
        for pgid in {proc.pid} if groups is None else groups | {proc.pid}:
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                proc.wait(timeout=0.05)  # reaps the leader once it exits
            except subprocess.TimeoutExpired:
                continue
            if not session_groups(proc.pid):  # empty, or None (no /proc: the leader is all it can wait for)
                return


def asv_env(results: Path, machine: str, sha: str) -> str | None:
    """The env_name asv gave the run of `sha` (part of a run's identity)."""
    for path in sorted((results / machine).glob(f"{sha[:8]}-*.json")):
        return json.loads(path.read_text()).get("env_name")
    return None


def tracked_branch(root: Path, sha: str) -> str | None:
    """The first of asv.conf.json's "branches" whose history (in `root`, as it is now: the local branch, else origin's,
    as a detached CI checkout has it) holds `sha`; None when none does or git cannot tell. Recorded with the run, so
    the records can show the tracked line's newest run first."""
    try:
        conf = json.loads((root / "asv.conf.json").read_text())
    except (OSError, ValueError):
        return None
    branches = conf.get("branches") if isinstance(conf, dict) else None
    for name in branches if isinstance(branches, list) else []:
        if not isinstance(name, str):
            continue
        for ref in (f"refs/heads/{name}", f"refs/remotes/origin/{name}"):
            done = subprocess.run(["git", "merge-base", "--is-ancestor", sha, ref], cwd=root, capture_output=True,
                                  text=True)
            if done.returncode == 0:
                return str(name)
    return None


def write_samples(jsonl: Path, sha: str, machine: str, results: Path, branch: str | None = None) -> Path | None:
    """Fold the JSONL into the samples sidecar of this run; None when nothing was recorded."""
    from kdengine.bench import samples

    if not jsonl.exists() or not jsonl.read_text().strip():
        say("no samples were written (KDENGINE_SAMPLES_OUT unused by the suites?)")
        return None
    return samples.write_sidecar(samples.collect_jsonl(jsonl, sha, machine, asv_env(results, machine, sha),
                                                       branch=branch), results)


def summarize_run(jsonl: Path, results: Path, machine: str, sha: str) -> None:
    """One line for what ran and one for what was skipped (and why)."""
    from kdengine.bench import samples

    measured = [r["name"] for r in samples.read_jsonl(jsonl)]
    skipped = 0
    for path in (results / machine).glob(f"{sha[:8]}-*.json"):
        for row in json.loads(path.read_text()).get("results", {}).values():
            values = row[0] if isinstance(row[0], list) else [row[0]]
            skipped += sum(v is None for v in values)
    say(f"measured {len(measured)} workloads: {', '.join(measured[:6])}{' ...' if len(measured) > 6 else ''}")
    if skipped:
        import torch

        why = "no CUDA GPU on this machine" if not torch.cuda.is_available() else "not runnable here (see log)"
        say(f"skipped {skipped} benchmark cases: {why}")


# --- confirmation --------------------------------------------------------------------------------------


def bench_regex(row: dict, sidecar: dict) -> str | None:
    """asv's --bench regex selecting exactly this workload's parameter combination."""
    res = sidecar.get("results", {}).get(row["name"])
    if res and res.get("asv_name"):
        return "^" + re.escape(history.asv_key(res["asv_name"], res.get("asv_params") or [])) + "$"
    if "(" in row["name"] or "." in row["name"]:  # an asv display name
        return "^" + re.escape(row["name"]) + "$"
    return None


def medians(jsonl: Path) -> dict[str, float]:
    from kdengine.bench import samples

    return {r["name"]: float(r["median"]) for r in samples.read_jsonl(jsonl)}


def confirm(args, result: dict, machine: str, head: str, new: Path, tmp: Path, root: Path,
            config: dict) -> int | None:
    """Re-measure the suspects of `result` (base and head interleaved, ABAB) within the time budget and
    replace their verdicts by the confirmed ones. From the second round on, a row the rounds confirm (regressed or
    improved) is not measured again: the rounds left go to the open rows (the rule tests/ci/synthetic.py models).
    Interrupted (SIGTERM, Ctrl-C): judged from the complete rounds so far, result["interrupted"] says so, and the
    signal's number is returned (else None)."""
    rows = gate.suspects(result)
    base = result.get("base")
    if not rows:
        return
    if not base:
        say(f"{len(rows)} suspects but no base commit to confirm against: they stay unconfirmed")
        return
    sidecar = {}
    side_files = sorted((new / "samples" / machine).glob(f"{head}*.json"))
    if side_files:
        sidecar = json.loads(side_files[-1].read_text())
    regexes = {r["name"]: bench_regex(r, sidecar) for r in rows}
    todo = [r for r in rows if regexes[r["name"]]]
    for r in rows:
        if not regexes[r["name"]]:
            r["reason"] = "could not be re-measured (no asv name): not confirmed; " + r["reason"]
            r["verdict"] = "noisy"
    if not todo or args.confirm_budget <= 0:
        for r in todo:
            r["verdict"], r["reason"] = "noisy", "confirmation off (--confirm-budget 0); " + r["reason"]
        return
    max_rounds = int(config["defaults"]["max_rounds"])
    say(f"confirming {len(todo)} suspects against {base[:10]}: rounds until confirmed, at most {max_rounds}, "
        f"budget {args.confirm_budget:.0f} s: " + ", ".join(r["name"] for r in todo))
    trees = {}
    for sha in dict.fromkeys([base, head]):
        tree = tmp / f"tree-{sha[:12]}"
        git("worktree", "add", "--detach", str(tree), sha, cwd=root)
        trees[sha] = tree
    values = {r["name"]: {"base": [], "head": []} for r in todo}
    start = time.monotonic()
    stopped, rounds_done = None, 0
    measured = todo  # this round's rows: a row confirmed (regressed or improved) is not measured again
    try:
        for rnd in range(max_rounds):
            round_start = time.monotonic()
            order = [("base", base), ("head", head)] if rnd % 2 == 0 else [("head", head), ("base", base)]
            for side, sha in order:
                out = tmp / f"confirm{rnd}-{side}"
                jsonl = run_asv(trees[sha], sha, machine, out, tmp, [regexes[r["name"]] for r in measured],
                                args.asv_arg or [], args.verbose, bench_tree=root)
                got = medians(jsonl)
                for r in measured:
                    if r["name"] in got:
                        values[r["name"]][side].append(got[r["name"]])
            rounds_done = rnd + 1
            now = time.monotonic()
            elapsed, last = now - start, now - round_start
            open_rows = [r for r in todo if not confirmed(r, values[r["name"]], config)]
            say(f"confirmation round {rnd + 1}/{max_rounds} done ({elapsed:.0f} s, {len(measured)} measured): "
                f"{len(todo) - len(open_rows)} confirmed, {len(open_rows)} open")
            if not open_rows and rnd + 1 >= MIN_ROUNDS:
                break
            if rnd + 1 >= MIN_ROUNDS and elapsed + next_round_s(last, len(measured), len(open_rows)) \
                    > args.confirm_budget:
                if rnd + 1 < max_rounds:
                    say(f"stopping after {rnd + 1} rounds: another would pass the {args.confirm_budget:.0f} s budget")
                break
            measured = open_rows
    except (Interrupted, KeyboardInterrupt) as e:
        stopped = stop_signal(e)
        name = signal.Signals(stopped).name
        result["interrupted"] = (f"confirmation stopped by {name} after {rounds_done} complete round(s) of at most "
                                 f"{max_rounds}: the suspects are judged from those (two a side are needed to "
                                 "confirm); not recorded: rerun the job")
        say(result["interrupted"])
        for v in values.values():  # a round cut short counts for neither side
            v["base"], v["head"] = v["base"][:rounds_done], v["head"][:rounds_done]
    finally:
        for tree in trees.values():
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=root, capture_output=True)
    for r in todo:
        v = values[r["name"]]
        if v["base"] and v["head"]:
            gate.confirm(r, v["base"], v["head"], config)
        else:
            r["verdict"], r["reason"] = "noisy", "the confirmation reruns did not measure it; " + r["reason"]
    return stopped


def write_pending(args, result: dict, head: str, first: dict) -> None:
    """The first pass into --json / --markdown before the confirmation rounds, marked undecided (replaced at the
    end; what a job killed during confirmation leaves)."""
    todo = gate.suspects(result)
    if not todo or not (args.json or args.markdown) or not result.get("base"):
        return
    pending = gate.summarize(result["base"], head, copy.deepcopy(result["machines"]), result.get("accepted"),
                             result.get("accept_notes"), apply=False)
    pending.update(first_pass=first, exit_code=None,
                   pending=f"first pass only: {len(todo)} suspect(s) were being re-measured when this was written "
                           "(base and head interleaved); the job did not finish its confirmation")
    report.write_outputs(pending, args.json, args.markdown)


def drop_unselected(result: dict, bench_filter: str) -> None:
    """Under --bench-filter the benchmarks it did not select are not "missing": drop them, with one note."""
    for m in result["machines"]:
        kept = [b for b in m["benchmarks"] if b["verdict"] != "missing"]
        if len(kept) < len(m["benchmarks"]):
            m["notes"].append(f"{len(m['benchmarks']) - len(kept)} benchmarks of the base were not selected by "
                              f"--bench-filter {bench_filter!r}: not compared")
        m["benchmarks"] = kept
    result["benchmarks"] = [b for m in result["machines"] for b in m["benchmarks"]]


def next_round_s(last_s: float, last_rows: int, next_rows: int) -> float:
    """The time the next confirmation round should take: the last round's (not the average, whose first round pays
    both trees' builds), scaled by the rows it will measure, with one row's worth of fixed cost per round (asv's start
    and the environment check on both sides)."""
    return last_s * (next_rows + 1) / (last_rows + 1)


def confirmed(row: dict, values: dict[str, list[float]], config: dict) -> bool:
    """True once the rounds so far confirm a regression or an improvement (the loop stops measuring it)."""
    if len(values["base"]) < MIN_ROUNDS or len(values["head"]) < MIN_ROUNDS:
        return False
    return gate.confirm(dict(row), values["base"], values["head"], config)["verdict"] in ("regressed", "improved")


# --- the job -------------------------------------------------------------------------------------------


def previous_base(results_dir: Path, machine: str, head: str, root: Path = ROOT) -> str | None:
    """The base to judge head against: head itself when it already has a run on this machine (a rerun:
    an A/A pair), else the nearest first-parent ancestor of head with results; None on a first run."""
    runs = history.load_all(results_dir, machine).get(machine, []) if results_dir.exists() else []
    have = {r.commit for r in runs}
    if head in have:
        return head
    for sha in git("rev-list", "--first-parent", "--max-count=1000", head, cwd=root).split()[1:]:
        if sha in have:
            return sha
    return None


def perf(args) -> int:
    """The main job under a SIGTERM handler: stopped before its confirmation (SIGTERM, Ctrl-C), asv is stopped and
    nothing is judged or recorded; during it, see confirm(); during recording, the record (and the job) is finished."""
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _perf(args)
    except (Interrupted, KeyboardInterrupt) as e:
        signum = stop_signal(e)
        say(f"stopped by {signal.Signals(signum).name} before the confirmation: nothing judged or recorded")
        return 128 + int(signum)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _perf(args) -> int:
    machine = args.machine or machine_name()
    root = Path(args.tree).resolve() if args.tree else ROOT
    head = git("rev-parse", "HEAD", cwd=root)
    results_dir = Path(args.results_dir)
    config = gate.load_thresholds(args.thresholds, args.priors)
    say(f"machine {machine}, head {head[:10]}, results {results_dir}")
    base = args.base or args.base_sha or previous_base(results_dir, machine, head, root)
    with tempfile.TemporaryDirectory(prefix="kdengine-perf-") as tmp_name:
        tmp = Path(tmp_name)
        new = tmp / "new"
        bench = [args.bench_filter] if args.bench_filter else []
        jsonl = run_asv(root, head, machine, new, tmp, bench, args.asv_arg or [], args.verbose)
        write_samples(jsonl, head, machine, new, tracked_branch(root, head))
        summarize_run(jsonl, new, machine, head)
        if not any((new / machine).glob(f"{head[:8]}-*.json")):
            raise RuntimeError(f"asv wrote no results for {head[:10]} on {machine}: nothing to judge or record "
                               "(see the asv log above)")
        merged = tmp / "merged"  # history + this run: what the gate reads
        if results_dir.exists():
            shutil.copytree(results_dir, merged, symlinks=True)
        record.install_results(new, merged)
        if base is None:
            say("no earlier results for this machine: every benchmark is new (first run)")
        else:
            say(f"judging {head[:10]} against {base[:10]}" + (" (a rerun: A/A pair)" if base == head else ""))
        result = gate.run_gate(str(merged), base, head, machine, args.thresholds, str(root), args.priors,
                               apply_accepted=False)
        if args.bench_filter:
            drop_unselected(result, args.bench_filter)
        first = dict(result["counts"])
        write_pending(args, result, head, first)
        stopped = confirm(args, result, machine, head, new, tmp, root, config)
        interrupted = result.get("interrupted")
        result = gate.summarize(result["base"], head, result["machines"], result.get("accepted"),
                                result.get("accept_notes"))
        result["first_pass"] = first
        if interrupted:
            result["interrupted"] = interrupted
            if result["exit_code"] != 1:
                result["exit_code"] = None  # undecided: not green, not amber (no verdict without the rounds)
        report.write_outputs(result, args.json, args.markdown)
        print(report.render_markdown(result), flush=True)
        verdict = {1: "RED: confirmed regression", None: "undecided (confirmation interrupted)",
                   3: f"AMBER: unsettled slowdown ({', '.join(result['unsettled'])}): not confirmed, not dismissed"}
        say(f"verdict: {verdict.get(result['exit_code'], 'green')} "
            f"(first pass {first}, final {result['counts']})")
        if stopped is not None:
            say("not recorded (interrupted)")
            return 1 if result["exit_code"] == 1 else 128 + int(stopped)
        if not args.no_record:
            deferred: list[int] = []
            signal.signal(signal.SIGTERM, lambda signum, _frame: deferred.append(signum))  # a record is finished
            out = record.record(new, results_dir, root if args.commit else None, args.push, args.remote,
                                args.branch)
            say(f"recorded {len(out['written'])} files into {results_dir}"
                + (" and committed" if out.get("committed") else ""))
            if deferred:
                say("SIGTERM while recording: the record was finished first, and so was the job")
        return result["exit_code"]


def add_parser(sub) -> None:
    p = sub.add_parser("perf", help="the main job: benchmark HEAD, gate, confirm, report, record",
                       description=__doc__)
    p.add_argument("--results-dir", default="perf_history")
    p.add_argument("--no-record", action="store_true", help="judge without writing to perf_history")
    p.add_argument("--commit", action="store_true", help="commit the recorded results (gitpython)")
    p.add_argument("--push", action="store_true", help="commit and push with fetch-rebase-retry")
    p.add_argument("--remote", default="origin")
    p.add_argument("--branch", default="main")
    p.add_argument("--base", default=None, help="judge against this commit (default: the previous recorded "
                                                "one, or head's own earlier run)")
    p.add_argument("--base-sha", default=None, help="alias of --base (the PR's base commit)")
    p.add_argument("--confirm-budget", type=float, default=300.0, metavar="SECONDS",
                   help="time for the interleaved confirmation reruns of suspects beyond the first two "
                        "rounds, which always run; later rounds measure only the rows not yet confirmed, and one "
                        "starts while the last round's time, scaled to those rows, fits (default 300; 0 = no "
                        "confirmation)")
    p.add_argument("--bench-filter", default=None, help="asv --bench regex")
    p.add_argument("--thresholds", default=None, help="floors TOML (default ci/thresholds.toml)")
    p.add_argument("--priors", default=None, help="run-to-run priors TOML (default ci/noise_prior.toml)")
    p.add_argument("--machine", default=None, help="machine name (default: from the fingerprint)")
    p.add_argument("--asv-arg", action="append", help="extra argument for `asv run` (repeatable)")
    p.add_argument("--tree", default=None, help="checkout to measure (default: this repository)")
    p.add_argument("--verbose", action="store_true", help="show asv's whole output")
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None)
    p.set_defaults(func=main)


def main(args) -> int:
    if args.confirm_budget < 0:
        raise ValueError(f"--confirm-budget: expected >= 0 seconds, got {args.confirm_budget}")
    if args.machine is not None:
        names.check_machine_name(args.machine, "--machine")
    args.commit = args.commit or args.push
    return perf(args)
