"""record: two clones of one bare repository record at once and both land, with no force push (every ref
update of the remote, from its reflog, is a fast-forward); a truncated result file is named and nothing is
written; records/*.txt are regenerated from the results. Faults (kills, symlinks, schemas): test_record_faults."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import asvdata  # noqa: E402

from ci import history, record  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def sh(*args, cwd):
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout


def make_results(tmp: Path, name: str, commit: str, seed: int) -> Path:
    rng = np.random.default_rng(seed)
    out = tmp / name
    asvdata.write_benchmarks(out)
    vals = {f"verify/{b}/ctx{c}/T16": list(1e-4 * c / 4096 * (1 + 0.01 * rng.standard_normal(20)))
            for b in ("triton", "triton_extend") for c in (4096, 16384, 65536)}
    asvdata.write_run(out, f"gpu-{name}", commit, 1_700_000_000_000 + seed, vals)
    return out


@pytest.fixture
def bare_and_clones(tmp_path):
    bare = tmp_path / "origin.git"
    sh("git", "init", "-q", "--bare", "-b", "main", str(bare), cwd=tmp_path)
    sh("git", "config", "core.logAllRefUpdates", "always", cwd=bare)  # the reflog shows every update
    seed = tmp_path / "seed"
    sh("git", "clone", "-q", str(bare), str(seed), cwd=tmp_path)
    for repo in (seed,):
        sh("git", "config", "user.email", "ci@example.invalid", cwd=repo)
        sh("git", "config", "user.name", "ci", cwd=repo)
    (seed / "perf_history").mkdir()
    (seed / "perf_history" / "README.md").write_text("results\n")
    sh("git", "add", ".", cwd=seed)
    sh("git", "commit", "-q", "-m", "init", cwd=seed)
    sh("git", "push", "-q", "origin", "main", cwd=seed)
    clones = []
    for name in ("a", "b"):
        c = tmp_path / f"clone-{name}"
        sh("git", "clone", "-q", str(bare), str(c), cwd=tmp_path)
        sh("git", "config", "user.email", f"{name}@example.invalid", cwd=c)
        sh("git", "config", "user.name", name, cwd=c)
        clones.append(c)
    return bare, clones


def test_two_runners_record_at_once_both_land(tmp_path, bare_and_clones):
    bare, clones = bare_and_clones
    procs = []
    for i, (clone, name) in enumerate(zip(clones, ("a", "b"), strict=True)):
        src = make_results(tmp_path, name, name * 40, i)
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "ci", "record", "--from", str(src), "--results-dir",
             str(clone / "perf_history"), "--repo", str(clone), "--push", "--branch", "main"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outs = [p.communicate(timeout=120)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    check = tmp_path / "check"
    sh("git", "clone", "-q", str(bare), str(check), cwd=tmp_path)
    files = sh("git", "ls-files", cwd=check)
    assert f"perf_history/gpu-a/{'a' * 8}-existing-py.json" in files
    assert f"perf_history/gpu-b/{'b' * 8}-existing-py.json" in files
    log = sh("git", "log", "--format=%s", cwd=check)
    assert log.count("[skip perf]") == 2
    text = (check / "perf_history" / "records" / record.RECORD_FILE).read_text()
    assert "## gpu-a" in text and "## gpu-b" in text  # regenerated with both runs after the rebase
    tips = sh("git", "reflog", "show", "--format=%H", "main", cwd=bare).split()[::-1]  # oldest first
    assert len(tips) == 3  # init + one push per runner
    for older, newer in zip(tips[:-1], tips[1:], strict=True):  # a force push: older tip not an ancestor
        assert subprocess.run(["git", "merge-base", "--is-ancestor", older, newer], cwd=bare).returncode == 0


def test_truncated_file_is_named_and_nothing_written(tmp_path):
    src = make_results(tmp_path, "a", "7" * 40, 7)
    dest = tmp_path / "perf_history"
    (dest / "gpu-a").mkdir(parents=True)
    existing = dest / "gpu-a" / "machine.json"
    existing.write_text("old")
    bad = src / "gpu-a" / f"{'7' * 8}-existing-py.json"
    bad.write_text(bad.read_text()[:100])
    with pytest.raises(history.DataError, match=bad.name):
        record.record(src, dest, None, False, "origin", "main")
    assert sorted(p.name for p in dest.rglob("*")) == ["gpu-a", "machine.json"]
    assert existing.read_text() == "old"


def test_records_text_from_results(tmp_path):
    src = make_results(tmp_path, "a", "9" * 40, 9)
    out = record.record(src, tmp_path / "ph", None, False, "origin", "main")
    text = (tmp_path / "ph" / "records" / record.RECORD_FILE).read_text()
    assert any(p.endswith(record.RECORD_FILE) for p in out["written"])
    lines = [ln for ln in text.splitlines() if "triton " in ln or "triton_extend" in ln]
    assert len(lines) == 6 and all("x" in ln for ln in lines)  # speedup column filled
    assert " 4k " in text and "64k" in text and "NVIDIA H200" in text and "9" * 12 in text


def test_records_keep_the_kernel_harness_section(tmp_path):
    kernel = sorted((ROOT / "perf_history" / "kernel").glob("*.json"))
    if not kernel:
        pytest.skip("no kernel harness results committed")
    (tmp_path / "ph" / "kernel").mkdir(parents=True)
    for p in kernel:
        (tmp_path / "ph" / "kernel" / p.name).write_bytes(p.read_bytes())
    src = make_results(tmp_path, "a", "5" * 40, 5)
    record.record(src, tmp_path / "ph", None, False, "origin", "main")
    text = (tmp_path / "ph" / "records" / record.RECORD_FILE).read_text()
    assert "kernel harness" in text and "# asv results" in text and "## gpu-a" in text


def test_records_list_what_a_partial_newest_run_left_out_with_its_older_run():
    """A gate check's filtered run (8 workloads) is the newest: the section still shows every workload history has, the
    left-out ones once each, from the newest run that measured them, with that run's commit."""
    P = history.Point
    old = history.Run("1" * 40, "gpu-a", 1_700_000_000.0, {
        "verify/cuda/ctx4096/T16": P(20e-6, "seconds", "lower"), "verify/triton/ctx4096/T16": P(40e-6, "seconds", "lower"),
        "verify/triton/ctx65536/T16": P(130e-6, "seconds", "lower")}, {"gpu": "NVIDIA H200"})
    mid = history.Run("2" * 40, "gpu-a", 1_700_000_100.0, {
        "verify/triton/ctx4096/T16": P(39e-6, "seconds", "lower")}, {"gpu": "NVIDIA H200"})
    new = history.Run("3" * 40, "gpu-a", 1_700_000_200.0, {
        "verify/cuda/ctx4096/T16": P(12e-6, "seconds", "lower")}, {"gpu": "NVIDIA H200"})
    text = record.format_record({"gpu-a": [old, mid, new]})
    lines = text.splitlines()
    assert "commit: " + "3" * 12 in text and "not in that run (2 workloads)" in text
    left_out = lines[lines.index(next(ln for ln in lines if ln.startswith("not in that run"))) + 1:]
    assert [ln.split()[2] for ln in left_out if ln.strip()] == ["triton", "triton"]
    assert "2" * 12 in left_out[0] and " 39 µs" in left_out[0]  # the newest value of triton 4k, from mid
    assert "1" * 12 in left_out[1] and " 64k " in left_out[1]
    assert sum("  cuda " in ln for ln in lines) == 1  # cuda 4k from the newest run only
    assert "not in that run" not in record.format_record({"gpu-a": [old]})  # a complete run: the table alone


def test_records_lead_with_the_tracked_branch_and_name_newer_runs_off_it():
    """A gate check's empty commit (off main) ran last: the table is main's newest run, the newer one is named below
    it, and what only it measured is still shown with its commit."""
    P = history.Point
    on_main = history.Run("4" * 40, "gpu-a", 1_700_000_000.0, {
        "verify/cuda/ctx4096/T16": P(20e-6, "seconds", "lower")}, {"gpu": "NVIDIA H200"}, branch="main")
    side = history.Run("5" * 40, "gpu-a", 1_700_000_100.0, {
        "verify/cuda/ctx4096/T16": P(12e-6, "seconds", "lower"),
        "verify/triton/ctx4096/T16": P(40e-6, "seconds", "lower")}, {"gpu": "NVIDIA H200"})
    lines = record.format_record({"gpu-a": [on_main, side]}).splitlines()
    assert any(ln.startswith("gpu: ") and "4" * 12 in ln for ln in lines)
    assert [ln for ln in lines if "  cuda " in ln] == [next(ln for ln in lines if "  cuda " in ln)]
    assert "20 µs" in next(ln for ln in lines if "  cuda " in ln)  # main's figure, not the side run's
    assert "5" * 12 in next(ln for ln in lines if "  triton " in ln)  # only the side run has it: shown, attributed
    assert any(ln.startswith("newer runs off the tracked branch: " + "5" * 12) for ln in lines)
    # without any run on the branch (results from before the flag): the newest run, as before
    on_main.branch = None
    lines = record.format_record({"gpu-a": [on_main, side]}).splitlines()
    assert any(ln.startswith("gpu: ") and "5" * 12 in ln for ln in lines)
    assert not any(ln.startswith("newer runs") for ln in lines)


def test_a_sidecars_branch_reaches_the_run(tmp_path):
    """The branch a sidecar carries is the loaded run's; a sidecar without one (before the flag) loads as None."""
    import json

    from kdengine.bench import samples

    results = make_results(tmp_path, "a", "6" * 40, 6)
    jsonl = tmp_path / "run.jsonl"
    jsonl.write_text(json.dumps({"name": "verify/triton/ctx4096/T16", "unit": "seconds", "direction": "lower",
                                 "median": 1e-4, "samples": [1e-4]}) + "\n")
    for branch in ("main", None):
        side = samples.collect_jsonl(jsonl, "6" * 40, "gpu-a", env="existing-py", branch=branch)
        path = samples.write_sidecar(side, results)
        run = next(r for r in history.load_all(str(results), "gpu-a")["gpu-a"] if r.run_id == side["run_id"])
        assert run.branch == branch
        path.unlink()


def test_perf_records_which_tracked_branch_held_the_commit(tmp_path):
    """ci perf stores the branch (asv.conf.json "branches") whose history holds the measured commit, None off it."""
    from ci import perf

    sh("git", "init", "-q", "-b", "main", cwd=tmp_path)
    sh("git", "config", "user.email", "t@t.invalid", cwd=tmp_path)
    sh("git", "config", "user.name", "t", cwd=tmp_path)
    (tmp_path / "asv.conf.json").write_text('{"branches": ["main"]}')
    sh("git", "add", "-A", cwd=tmp_path)
    sh("git", "commit", "-q", "-m", "a", cwd=tmp_path)
    on_main = sh("git", "rev-parse", "HEAD", cwd=tmp_path).strip()
    sh("git", "checkout", "-q", "-b", "side", cwd=tmp_path)
    sh("git", "commit", "-q", "--allow-empty", "-m", "b", cwd=tmp_path)
    off = sh("git", "rev-parse", "HEAD", cwd=tmp_path).strip()
    assert perf.tracked_branch(tmp_path, on_main) == "main"
    assert perf.tracked_branch(tmp_path, off) is None
    # a detached CI checkout: no local main, origin's
    sh("git", "update-ref", "refs/remotes/origin/main", on_main, cwd=tmp_path)
    sh("git", "checkout", "-q", "--detach", off, cwd=tmp_path)
    sh("git", "branch", "-q", "-D", "main", cwd=tmp_path)
    assert perf.tracked_branch(tmp_path, on_main) == "main" and perf.tracked_branch(tmp_path, off) is None
    for conf in ("not json", "[]", '{"branches": "main"}'):  # unreadable or malformed: unknown, never an error
        (tmp_path / "asv.conf.json").write_text(conf)
        assert perf.tracked_branch(tmp_path, on_main) is None


def test_records_show_ours_over_flashmla_where_the_run_has_the_peer():
    P = history.Point
    points = {"verify/cuda/ctx65536/T16": P(130e-6, "seconds", "lower"),
              "verify/triton_extend/ctx65536/T16": P(260e-6, "seconds", "lower"),
              "verify-peer/flashmla/ctx65536/T16": P(50e-6, "seconds", "lower"),
              "decode/cuda/ctx65536": P(100.0, "tok/s", "higher")}
    run = history.Run("7" * 40, "gpu-a", 1_700_000_000.0, points, {"gpu": "NVIDIA H200"})
    text = record.format_record({"gpu-a": [run]})
    lines = text.splitlines()
    at = next(i for i, ln in enumerate(lines) if ln.startswith("ours / peer"))
    assert lines[at + 2].split()[:3] == ["65536", "16", "flashmla"] and "2.60x" in lines[at + 2]
    assert lines[at - 1].split()[:3] == ["64k", "16", "triton_extend"]  # after the verify table
    assert text.endswith(lines[at + 2] + "\n")  # and closes the machine's section
    run.points.pop("verify-peer/flashmla/ctx65536/T16")
    assert "ours / peer" not in record.format_record({"gpu-a": [run]})


def test_committed_records_file_is_what_the_committed_results_regenerate_to():
    """perf_history/records/*.txt in this checkout matches its results (a JSON committed under perf_history/kernel
    without `python -m ci record` or record.write_records fails here, before a stale file misleads a reader)."""
    results = ROOT / "perf_history"
    assert (results / record.RECORDS_REL).read_bytes() == record.render_records(results, {}), (
        "stale records file: run `python -c \"from pathlib import Path; from ci import record; "
        "record.write_records(Path('perf_history'))\"`")
