"""asv end to end on the CPU default, in a temp dir: check, machine, run --quick, publish; the samples
JSONL folds into a sidecar. Mirrors what the CI does on a CPU-only box (asv.conf.json, forkserver)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kdengine.bench import fingerprint, workloads
from kdengine.bench import samples as S

ROOT = Path(__file__).resolve().parents[2]


def asv(tmp_path: Path, env: dict, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "asv", *args, "--config", str(tmp_path / "asv.conf.json")],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


@pytest.mark.slow
def test_asv_quick_run_results_sidecar_and_publish(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("the CPU default suite is skipped on a GPU machine")
    conf = json.loads((ROOT / "asv.conf.json").read_text())
    assert conf["environment_type"] == "existing" and conf["results_dir"] == "perf_history"
    conf.update(repo=str(ROOT), benchmark_dir=str(ROOT / "benchmarks"), results_dir=str(tmp_path / "results"),
                html_dir=str(tmp_path / "html"))
    (tmp_path / "asv.conf.json").write_text(json.dumps(conf))
    jsonl = tmp_path / "samples.jsonl"
    env = {**os.environ, "HOME": str(tmp_path), "KDENGINE_SAMPLES_OUT": str(jsonl),
           "KDENGINE_CACHE_DIR": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    env.pop("KDENGINE_BENCH_SAMPLES", None)
    sha = fingerprint.commit()["commit"]
    machine = fingerprint.machine_name()
    asv(tmp_path, env, "check", "--python=same")
    asv(tmp_path, env, "machine", "--yes", "--machine", machine)
    asv(tmp_path, env, "run", "--python=same", "--quick", "--set-commit-hash", sha, "--machine", machine)

    result_files = list((tmp_path / "results" / machine).glob(f"{sha[:8]}-existing-*.json"))
    assert len(result_files) == 1 and (tmp_path / "results" / "benchmarks.json").exists()
    results = json.loads(result_files[0].read_text())["results"]
    times = results["bench_verify.CpuVerify.track_time"][0]
    assert len(times) == 4 and all(t > 0 for t in times)
    assert all(t != t for t in results["bench_verify.Verify.track_time"][0])  # GPU cases: skipped (NaN)

    records = S.read_jsonl(jsonl)
    names = {r["name"] for r in records}
    assert {w.name for w in workloads.cpu_workloads() if w.kind == "verify"} <= names
    assert len(records) == len(names)  # one measurement per workload, shared by its track_ metrics
    verify = [r for r in records if r["name"].startswith("cpu-verify/")]
    assert all(len(r["samples"]) == workloads.CPU_QUICK_SAMPLES for r in verify)  # --quick was seen
    assert all(r["asv_name"] == "bench_verify.CpuVerify.track_time" for r in verify)
    path = S.write_sidecar(S.collect_jsonl(jsonl, sha, machine), tmp_path / "results")
    assert json.loads(path.read_text())["results"].keys() == names

    asv(tmp_path, env, "publish")
    assert (tmp_path / "html" / "index.html").exists()
