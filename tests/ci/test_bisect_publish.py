"""bisect names the commit that made a small CPU benchmark 30% slower; the published asv site renders a
benchmark graph in headless Chromium (skipped where Chromium is absent); publish refuses a results directory
with HTML in a machine, benchmark or parameter name."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
import asvdata  # noqa: E402

from ci import bisect, publish  # noqa: E402

BENCH = """import time, sys
WORK = {work}
def run():
    t0 = time.process_time()
    s = 0
    for i in range(WORK):
        s += i * i
    return time.process_time() - t0
print(min(run() for _ in range(7)))  # CPU time, min of 7: robust to a busy machine
"""


def sh(*args, cwd):
    return subprocess.run(args, cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_repo(path: Path) -> tuple[str, str, str]:
    path.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=path)
    sh("git", "config", "user.email", "t@example.invalid", cwd=path)
    sh("git", "config", "user.name", "t", cwd=path)
    shas = []
    for i in range(8):
        work = 130_000 if i >= 5 else 100_000  # commit 5 makes the loop 30% longer
        (path / "bench.py").write_text(BENCH.format(work=work))
        (path / f"note{i}.txt").write_text(str(i))
        sh("git", "add", ".", cwd=path)
        sh("git", "commit", "-q", "-m", f"change {i}", cwd=path)
        shas.append(sh("git", "rev-parse", "HEAD", cwd=path))
    return shas[0], shas[5], shas[-1]


def test_bisect_names_the_planted_commit(tmp_path):
    repo = tmp_path / "repo"
    good, culprit, _ = make_repo(repo)  # bad given as HEAD: resolved in the repo, not the worktree
    out = bisect.bisect(repo, good, "HEAD", "cpu-loop", runs=8, cmd=f"{sys.executable} bench.py", build=None,
                        direction="lower", threshold=0.10, alpha=0.05)
    assert out["culprit"] == culprit
    assert out["subject"] == "change 5"
    assert 16 <= out["runs"] <= 16 + 16 * 3 * 4
    assert sh("git", "worktree", "list", cwd=repo).count("\n") == 0  # temporary worktree removed


def make_site_repo(tmp: Path) -> tuple[Path, Path]:
    repo = tmp / "proj"
    repo.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=repo)
    sh("git", "config", "user.email", "t@example.invalid", cwd=repo)
    sh("git", "config", "user.name", "t", cwd=repo)
    results = repo / "perf_history"
    asvdata.write_benchmarks(results)
    rng = np.random.default_rng(0)
    for i in range(4):
        (repo / "f.txt").write_text(str(i))
        sh("git", "add", "f.txt", cwd=repo)
        sh("git", "commit", "-q", "-m", f"c{i}", cwd=repo)
        sha = sh("git", "rev-parse", "HEAD", cwd=repo)
        date = int(sh("git", "log", "-1", "--format=%ct", cwd=repo)) * 1000
        vals = {f"verify/triton/ctx{c}/T16": list(1e-4 * c / 4096 * (1 + 0.01 * rng.standard_normal(20)))
                for c in (4096, 16384)}
        asvdata.write_run(results, "cpu-test", sha, date, vals)
    (repo / "asv.conf.json").write_text('{"version": 1, "project": "t", "repo": ".", "branches": ["main"],'
                                        ' "environment_type": "existing", "results_dir": "perf_history"}')
    return repo, results


def test_publish_writes_site(tmp_path):
    repo, results = make_site_repo(tmp_path)
    index = publish.publish(results, tmp_path / "site", repo=repo)
    assert index.exists() and (tmp_path / "site" / "graphs").is_dir()


@pytest.mark.parametrize("where", ["machine", "benchmark", "param"])
def test_publish_refuses_html_in_names(tmp_path, where):
    import json

    from ci.history import DataError

    repo, results = make_site_repo(tmp_path)
    hostile = '<img src=x onerror="alert(1)">'
    if where == "machine":
        (results / "cpu-test").rename(results / f"cpu-{hostile}")
        (results / f"cpu-{hostile}" / "machine.json").write_text(json.dumps({"machine": f"cpu-{hostile}",
                                                                              "version": 1}))
    else:
        index = json.loads((results / "benchmarks.json").read_text())
        name = next(k for k in index if k != "version")
        if where == "benchmark":
            index[f"bench.{hostile}"] = dict(index.pop(name), name=f"bench.{hostile}")
        else:
            index[name]["params"][0].append(f"'{hostile}'")
        (results / "benchmarks.json").write_text(json.dumps(index))
    with pytest.raises(DataError, match="expected"):
        publish.publish(results, tmp_path / "site", repo=repo)
    assert not (tmp_path / "site").exists()


@pytest.mark.skipif(shutil.which("chromium") is None, reason="needs Debian's chromium (.ci/run installs it)")
@pytest.mark.skipif(not publish.ASSETS.is_dir(),
                    reason="needs the site's JS in ci/assets/node_modules (.ci/run: npm install --prefix ci/assets)")
def test_published_site_shows_a_graph_in_chromium(tmp_path):
    repo, results = make_site_repo(tmp_path)
    site = tmp_path / "site"
    publish.publish(results, site, repo=repo)
    server = subprocess.Popen([sys.executable, "-m", "http.server", "0", "--bind", "127.0.0.1"], cwd=site,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        port = server.stdout.readline().split("port ")[1].split()[0]
        url = f"http://127.0.0.1:{port}/#bench_verify.Verify.track_time"
        flags = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 f"--user-data-dir={tmp_path / 'profile'}", "--virtual-time-budget=8000"]
        dom = subprocess.run(["chromium", *flags, "--dump-dom", url], capture_output=True, text=True,
                             timeout=90).stdout
        shot = tmp_path / "shot.png"
        subprocess.run(["chromium", *flags, "--window-size=1200,800", f"--screenshot={shot}", url],
                       capture_output=True, timeout=90)
    finally:
        server.terminate()
        server.wait(timeout=10)
    assert "flot-base" in dom or "<canvas" in dom  # the graph canvas asv draws with flot
    assert shot.exists() and shot.stat().st_size > 5000
