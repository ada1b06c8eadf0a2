"""record under faults: kill -9 at random moments (while another runner pushes, so kills land in commits,
fetches and rebases too) never leaves the remote or the checkout inconsistent and loses no run once
recovered; concurrent records of one commit on one machine all land (a retry happens, both runs' samples
stay); symlinks, special files, schema-invalid and hostile-named files are refused before anything is
written; a sidecar of a run is never replaced. The remote logs every ref update: no force push."""

from __future__ import annotations

import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import git
import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import asvdata  # noqa: E402

from ci import history, record  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
MACHINE = "gpu-test"
OTHER = "gpu-other"  # the competing runner's machine: its records section conflicts with ours in rebases
VERIFY_ASV = next(name for name in asvdata.BENCHMARKS if ".Verify." in name)
KILLS = int(os.environ.get("KDENGINE_RECORD_KILLS", "12"))  # raise for a longer fuzz
UPDATE_HOOK = """#!/bin/sh
# every ref update: "<ref> <old> <new>"; a non-fast-forward one also goes to forced.log
echo "$1 $2 $3" >> "$GIT_DIR/updates.log"
if [ "$2" != 0000000000000000000000000000000000000000 ] && ! git merge-base --is-ancestor "$2" "$3"; then
  echo "$1 $2 $3" >> "$GIT_DIR/forced.log"
fi
"""
# A record process that has imported everything and waits for a line on stdin, so a kill lands in the record
# itself rather than in the interpreter's start-up.
DRIVER = """import sys, json, time
from pathlib import Path
from ci import record
print("ready", flush=True)
sys.stdin.readline()
t0 = time.monotonic()
out = record.record(Path(sys.argv[1]), Path(sys.argv[2]) / "perf_history", Path(sys.argv[2]), True, "origin", "main")
print(json.dumps({"push_attempts": out["push_attempts"], "seconds": time.monotonic() - t0}))
"""


def sh(*args, cwd):
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


def sha_of(i: int, tag: str = "c") -> str:
    return (f"{tag}{i:x}".encode().hex() * 20)[:40]


def run_id_of(i: int, who: str) -> str:
    return f"20260101T{i % 24:02d}0000Z-{sum(map(ord, who)) & 0xFFFF:04x}{i % 256:02x}"


def make_batch(tmp: Path, commit: str, run_id: str, seed: int, machine: str = MACHINE) -> Path:
    """asv result + machine.json + benchmarks.json + a schema 2 sidecar of run `run_id`."""
    rng = np.random.default_rng(seed)
    out = tmp / f"batch-{commit[:8]}-{run_id}"
    asvdata.write_benchmarks(out)
    vals = {f"verify/{b}/ctx{c}/T16": list(1e-4 * c / 4096 * (1 + 0.01 * rng.standard_normal(10)))
            for b in ("triton", "triton_extend") for c in (4096, 65536)}
    asvdata.write_run(out, machine, commit, 1_700_000_000_000 + seed, vals, sidecar=False)
    side = out / "samples" / machine
    side.mkdir(parents=True)
    results = {w: {"asv_name": VERIFY_ASV, "asv_params": [f"'{w.split('/')[1]}'",
               w.split("/")[2][3:], "16"], "unit": "seconds", "direction": "lower", "median": statistics.median(v),
               "samples": v, "throttled": False, "extra": {}} for w, v in vals.items()}
    (side / f"{commit}-{run_id}.json").write_text(json.dumps({
        "schema": 2, "commit": commit, "machine": machine, "run_id": run_id, "env": "existing-py",
        "date": "2026-01-01T00:00:00+00:00", "fingerprint": dict(asvdata.FINGERPRINT, commit=commit),
        "results": results}))
    return out


@pytest.fixture
def remote(tmp_path):
    """A bare origin (with the ref-update log hook) and a function making configured clones of it."""
    bare = tmp_path / "origin.git"
    sh("git", "init", "-q", "--bare", "-b", "main", str(bare), cwd=tmp_path)
    hook = bare / "hooks" / "update"
    hook.write_text(UPDATE_HOOK)
    hook.chmod(0o755)
    seed = clone(bare, tmp_path / "seed", "seed")
    (seed / "perf_history").mkdir()
    (seed / "perf_history" / "README.md").write_text("results\n")
    sh("git", "add", ".", cwd=seed)
    sh("git", "commit", "-q", "-m", "init", cwd=seed)
    sh("git", "push", "-q", "origin", "main", cwd=seed)
    return bare


def clone(bare: Path, path: Path, name: str) -> Path:
    sh("git", "clone", "-q", str(bare), str(path), cwd=bare.parent)
    sh("git", "config", "user.email", f"{name}@example.invalid", cwd=path)
    sh("git", "config", "user.name", name, cwd=path)
    # the remote's side of a push (git-receive-pack, which takes the remote's ref locks) runs in a session of its own,
    # as a server's does: the fuzz's kill -9 of a runner's process group then ends the runner, not the remote (killed
    # with it, a receive-pack holding refs/heads/main.lock left that lock behind and every later push was refused)
    sh("git", "config", "remote.origin.receivepack", "setsid --wait git-receive-pack", cwd=path)
    return path


def sidecars_on(bare: Path) -> set[str]:
    files = sh("git", "--git-dir", str(bare), "ls-tree", "-r", "--name-only", "main", "perf_history/samples", cwd=bare)
    return {Path(f).name for f in files.split()}


def check_no_force(bare: Path) -> int:
    """Number of ref updates the remote took; fails on a non-fast-forward one."""
    assert not (bare / "forced.log").exists(), (bare / "forced.log").read_text()
    return len((bare / "updates.log").read_text().splitlines())


def check_records_match_results(results_dir: Path) -> None:
    """records/*.txt is what the results beside it regenerate to (names no run that is not there)."""
    expect = record.render_records(results_dir, {})
    assert (results_dir / record.RECORDS_REL).read_bytes() == expect


def check_remote_tip(bare: Path, tmp: Path) -> None:
    dest = tmp / f"tip-{time.monotonic_ns()}"
    dest.mkdir()
    archive = dest / "tip.tar"
    sh("git", "--git-dir", str(bare), "archive", "-o", str(archive), "main", cwd=bare)
    with tarfile.open(archive) as tar:
        tar.extractall(dest, filter="data")
    if (dest / "perf_history" / record.RECORDS_REL).exists():
        check_records_match_results(dest / "perf_history")


def check_checkout(repo_dir: Path) -> None:
    """After recovery: on the branch, no rebase, nothing uncommitted or stray, records consistent."""
    repo = git.Repo(repo_dir)
    assert not repo.head.is_detached
    assert not (Path(repo.git_dir) / "rebase-merge").exists() and not (Path(repo.git_dir) / "rebase-apply").exists()
    assert sh("git", "status", "--porcelain", "--untracked-files=all", cwd=repo_dir) == ""
    if (repo_dir / "perf_history" / record.RECORDS_REL).exists():
        check_records_match_results(repo_dir / "perf_history")


def classify_after_kill(repo_dir: Path, bare: Path, sidecar: str) -> str:
    """The state a kill left, before recovery: every one must be one recovery knows."""
    git_dir = repo_dir / ".git"
    if sidecar in sidecars_on(bare):
        return "pushed"
    if (repo_dir / "perf_history" / record.JOURNAL).exists():
        return "journal (install or commit interrupted)"
    if (git_dir / "rebase-merge").exists() or (git_dir / "rebase-apply").exists():
        return "rebase interrupted"
    status = sh("git", "status", "--porcelain", "--untracked-files=all", cwd=repo_dir)
    stray = [ln for ln in status.splitlines() if record.STAGING_PREFIX not in ln and f"{record.JOURNAL}.tmp" not in ln]
    assert not stray, status  # without a journal or a rebase, nothing half-done may show
    if status:
        return "staged, journal not yet in place"
    local = sh("git", "ls-tree", "-r", "--name-only", "HEAD", "perf_history/samples", cwd=repo_dir)
    return "committed, not pushed" if sidecar in local else "untouched"


def spawn_driver(src: Path, repo_dir: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", DRIVER, str(src), str(repo_dir)], cwd=ROOT,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                            start_new_session=True)


def start(proc: subprocess.Popen) -> None:
    """Wait until the driver has imported everything, then let it record."""
    assert proc.stdout.readline().strip() == "ready"
    proc.stdin.write("go\n")
    proc.stdin.flush()


@pytest.mark.slow
def test_kill_9_fuzz_keeps_remote_and_checkout_consistent(tmp_path, remote):
    a = clone(remote, tmp_path / "a", "a")
    b = clone(remote, tmp_path / "b", "b")
    rng = random.Random(14)
    batches = [make_batch(tmp_path, sha_of(i), run_id_of(i, "a"), i) for i in range(KILLS)]
    # one unkilled record measures how long a record with a rejected push takes
    record.record(make_batch(tmp_path, sha_of(0, "b"), run_id_of(0, "b"), 100, OTHER), b / "perf_history", b,
                  True, "origin", "main")
    proc = spawn_driver(make_batch(tmp_path, sha_of(99), run_id_of(99, "a"), 99), a)
    start(proc)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0
    span = json.loads(out.strip().splitlines()[-1])["seconds"]
    expected = {f"{sha_of(0, 'b')}-{run_id_of(0, 'b')}.json", f"{sha_of(99)}-{run_id_of(99, 'a')}.json"}
    states: dict[str, int] = {}
    consistent = 0
    ready = spawn_driver(batches[0], a)
    for i in range(KILLS):
        proc = ready
        record.record(make_batch(tmp_path, sha_of(i + 1, "b"), run_id_of(i + 1, "b"), 200 + i, OTHER),
                      b / "perf_history", b, True, "origin", "main")  # a's next push is rejected: a rebases
        expected.add(f"{sha_of(i + 1, 'b')}-{run_id_of(i + 1, 'b')}.json")
        start(proc)
        time.sleep(rng.uniform(0, span))
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        if i + 1 < KILLS:
            ready = spawn_driver(batches[i + 1], a)
        state = classify_after_kill(a, remote, f"{sha_of(i)}-{run_id_of(i, 'a')}.json")
        states[state] = states.get(state, 0) + 1
        check_remote_tip(remote, tmp_path)
        record.recover(a / "perf_history", a)
        check_checkout(a)
        consistent += 1
    for i, src in enumerate(batches):  # the runs killed before they landed are recorded again, idempotently
        record.record(src, a / "perf_history", a, True, "origin", "main")
        expected.add(f"{sha_of(i)}-{run_id_of(i, 'a')}.json")
    assert expected <= sidecars_on(remote), expected - sidecars_on(remote)  # no run lost
    check_checkout(a)
    sh("git", "fetch", "-q", "origin", cwd=a)
    assert sh("git", "rev-parse", "HEAD", cwd=a) == sh("git", "rev-parse", "origin/main", cwd=a)
    check_remote_tip(remote, tmp_path)
    updates = check_no_force(remote)
    print(f"\n[fuzz] record takes {span:.2f} s; kills: {KILLS}, consistent after recovery: {consistent}, states: {states}, "
          f"runs landed: {len(expected)}/{len(expected)}, ref updates: {updates}, forced: 0")
    assert consistent == KILLS


def test_concurrent_same_commit_records_all_land_after_a_retry(tmp_path, remote):
    commit = sha_of(7)
    runners = [clone(remote, tmp_path / f"r{i}", f"r{i}") for i in range(3)]
    total, attempts = 0, []
    for rnd in range(2):
        procs = []
        for i, repo in enumerate(runners):
            src = make_batch(tmp_path, commit, run_id_of(10 * rnd + i, f"r{i}"), 10 * rnd + i)
            procs.append(spawn_driver(src, repo))
        for p in procs:
            start(p)
        outs = [p.communicate(timeout=180) for p in procs]
        assert [p.returncode for p in procs] == [0] * len(procs)
        attempts += [json.loads(o[0].strip().splitlines()[-1])["push_attempts"] for o in outs]
        total += len(procs)
    landed = sidecars_on(remote)
    expected = {f"{commit}-{run_id_of(10 * rnd + i, f'r{i}')}.json" for rnd in range(2) for i in range(3)}
    assert expected <= landed, expected - landed  # none lost
    assert max(attempts) >= 2, attempts  # someone was rejected, fetched, rebased and retried
    files = sh("git", "--git-dir", str(remote), "ls-tree", "-r", "--name-only", "main", cwd=remote)
    assert f"perf_history/{MACHINE}/{commit[:8]}-existing-py.json" in files  # asv: one file, the newest run's
    check_no_force(remote)
    check_remote_tip(remote, tmp_path)
    print(f"\n[concurrent] same-commit records: {total}, landed: {len(expected & landed)}, push attempts: {attempts}")


# --- refused before anything is written ----------------------------------------------------------------


def snapshot(path: Path) -> dict[str, bytes]:
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()} if path.exists() else {}


def refused(src: Path, dest: Path, match: str) -> None:
    before = snapshot(dest)
    with pytest.raises(history.DataError, match=match):
        record.record(src, dest, None, False, "origin", "main")
    assert snapshot(dest) == before


def test_symlink_and_fifo_in_the_batch_are_refused(tmp_path):
    dest = tmp_path / "ph"
    record.record(make_batch(tmp_path, sha_of(1), run_id_of(1, "x"), 1), dest, None, False, "o", "m")
    secret = tmp_path / "secret.json"
    secret.write_text('{"version": 2}')
    src = make_batch(tmp_path, sha_of(2), run_id_of(2, "x"), 2)
    (src / MACHINE / "evil.json").symlink_to(secret)
    refused(src, dest, "symlink")
    src = make_batch(tmp_path, sha_of(3), run_id_of(3, "x"), 3)
    os.mkfifo(src / MACHINE / "pipe.json")
    refused(src, dest, "special file")


def test_symlinked_machine_directory_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    dest = tmp_path / "ph"
    dest.mkdir()
    (dest / MACHINE).symlink_to(outside, target_is_directory=True)
    refused(make_batch(tmp_path, sha_of(4), run_id_of(4, "x"), 4), dest, "symlink")
    assert list(outside.iterdir()) == []


@pytest.mark.parametrize("corrupt, match", [
    (lambda d: d.update(version=1), "version 2"),
    (lambda d: d["results"].update({"bench_verify.<script>": next(iter(d["results"].values()))}),
     "benchmark name"),
    (lambda d: d.update(commit_hash="not-a-sha"), "not a sha"),
    (lambda d: d["params"].update(machine="other"), "params.machine"),
])
def test_invalid_asv_result_is_refused(tmp_path, corrupt, match):
    src = make_batch(tmp_path, sha_of(5), run_id_of(5, "x"), 5)
    path = src / MACHINE / f"{sha_of(5)[:8]}-existing-py.json"
    data = json.loads(path.read_text())
    corrupt(data)
    path.write_text(json.dumps(data))
    refused(src, tmp_path / "ph", match)


@pytest.mark.parametrize("corrupt, match", [
    (lambda d: d.update(schema=3), "schema 3"),
    (lambda d: d.pop("results"), "without 'results'"),
    (lambda d: d.update(run_id="../x"), "run_id"),
    (lambda d: d["results"].update({'<img src=x onerror="1">': {}}), "workload name"),
    (lambda d: d.update(machine="gpu-other"), "directory"),
])
def test_invalid_sidecar_is_refused(tmp_path, corrupt, match):
    src = make_batch(tmp_path, sha_of(6), run_id_of(6, "x"), 6)
    path = next((src / "samples" / MACHINE).glob("*.json"))
    data = json.loads(path.read_text())
    corrupt(data)
    path.write_text(json.dumps(data))
    refused(src, tmp_path / "ph", match)


def test_hostile_machine_directory_and_truncated_file_are_refused(tmp_path):
    src = make_batch(tmp_path, sha_of(8), run_id_of(8, "x"), 8, machine="gpu-<b>")
    refused(src, tmp_path / "ph", "machine directory")
    src = make_batch(tmp_path, sha_of(9), run_id_of(9, "x"), 9)
    (src / "samples" / MACHINE / f"{sha_of(9)}-{run_id_of(9, 'x')}.json").write_text('{"schema": 2, "com')
    refused(src, tmp_path / "ph", "truncated")


def test_a_run_is_never_replaced_and_same_bytes_are_skipped(tmp_path):
    dest = tmp_path / "ph"
    src = make_batch(tmp_path, sha_of(10), run_id_of(10, "x"), 10)
    record.record(src, dest, None, False, "o", "m")
    again = record.record(src, dest, None, False, "o", "m")  # a re-run after a crash: idempotent
    assert len(again["unchanged"]) == 4 and again["replaced"] == []
    sidecar = next((src / "samples" / MACHINE).glob("*.json"))
    data = json.loads(sidecar.read_text())
    data["date"] = "2027-01-01T00:00:00+00:00"
    sidecar.write_text(json.dumps(data))
    refused(src, dest, "never replaced")
    other = make_batch(tmp_path, sha_of(10), run_id_of(11, "x"), 11)  # same commit, another run
    out = record.record(other, dest, None, False, "o", "m")
    assert out["replaced"] == [f"{MACHINE}/{sha_of(10)[:8]}-existing-py.json"]
    assert len(list((dest / "samples" / MACHINE).glob("*.json"))) == 2  # both runs' samples kept


def test_a_crash_mid_install_is_rolled_back(tmp_path, monkeypatch):
    dest = tmp_path / "ph"
    record.record(make_batch(tmp_path, sha_of(12), run_id_of(12, "x"), 12), dest, None, False, "o", "m")
    before = snapshot(dest)
    calls = []

    def crash_on_third(src, dst):
        calls.append(dst)
        if len(calls) == 3:
            raise KeyboardInterrupt  # stands in for a kill between two renames
        os.rename(src, dst)

    monkeypatch.setattr(record.os, "replace", crash_on_third)
    with pytest.raises(KeyboardInterrupt):
        record.record(make_batch(tmp_path, sha_of(13), run_id_of(13, "x"), 13), dest, None, False, "o", "m")
    monkeypatch.undo()
    assert (dest / record.JOURNAL).exists()
    expected = f"interrupted record in {dest}: run `python -m ci record --recover`"
    with pytest.raises(history.DataError, match=f"^{re.escape(expected)}$"):
        history.load_histories(dest)  # the gate never judges against a half-installed batch
    assert record.recover(dest, None)[0].startswith("rolled back")
    assert snapshot(dest) == before
    assert MACHINE in history.load_histories(dest)


def test_interrupted_rebase_is_aborted_and_the_run_pushed(tmp_path, remote):
    a, b = clone(remote, tmp_path / "a", "a"), clone(remote, tmp_path / "b", "b")
    record.record(make_batch(tmp_path, sha_of(20), run_id_of(20, "b"), 20), b / "perf_history", b, True, "origin", "main")
    record.record(make_batch(tmp_path, sha_of(21), run_id_of(21, "a"), 21), a / "perf_history", a, False, "o", "m")
    sh("git", "fetch", "-q", "origin", cwd=a)
    subprocess.run(["git", "rebase", "origin/main"], cwd=a, capture_output=True)  # stops on the records conflict
    assert (a / ".git" / "rebase-merge").exists() or (a / ".git" / "rebase-apply").exists()
    out = record.record(make_batch(tmp_path, sha_of(22), run_id_of(22, "a"), 22), a / "perf_history", a, True,
                        "origin", "main")
    assert "aborted a rebase left by an interrupted record" in out["recovered"]
    landed = sidecars_on(remote)
    assert {f"{sha_of(c)}-{run_id_of(c, w)}.json" for c, w in ((20, "b"), (21, "a"), (22, "a"))} <= landed
    check_checkout(a)
    check_no_force(remote)


def test_export_hands_the_uncommitted_results_to_another_job(tmp_path, remote):
    a = clone(remote, tmp_path / "a", "a")
    record.record(make_batch(tmp_path, sha_of(30), run_id_of(30, "a"), 30), a / "perf_history", None, False, "o", "m")
    out = tmp_path / "export"
    written = record.export_changes(a / "perf_history", a, out)
    assert sorted(p.relative_to(out).as_posix() for p in written) == sorted([
        "benchmarks.json", f"{MACHINE}/machine.json", f"{MACHINE}/{sha_of(30)[:8]}-existing-py.json",
        f"samples/{MACHINE}/{sha_of(30)}-{run_id_of(30, 'a')}.json"])  # records/ regenerate where recorded
    b = clone(remote, tmp_path / "b", "b")
    record.record(out, b / "perf_history", b, True, "origin", "main")
    assert f"{sha_of(30)}-{run_id_of(30, 'a')}.json" in sidecars_on(remote)
