"""Published workload names never change (history is keyed by them); selection and measuring on the CPU."""

from __future__ import annotations

import pytest

from kdengine.bench import workloads as W

# The published names, frozen. Adding a workload appends here; renaming or removing one is a bug.
FROZEN_GPU = (
    [f"verify/{b}/ctx{n}/T{t}" for b in ("reference", "triton", "triton_extend", "cuda")
     for n in (4096, 16384, 65536) for t in (16, 64)]
    + [f"verify-nsplit/{b}/ctx65536/T{t}/s{s}" for b in ("cuda", "triton") for t in (16, 64)
       for s in ("16", "32", "64", "128", "256", "auto")]
    + [f"decode/{b}/ctx{n}" for b in ("triton_extend", "triton", "cuda") for n in (4096, 16384, 65536)]
    + ["tree/device/budget63"]
    + [f"verify-peer/flashmla/ctx{n}/T{t}" for n in (4096, 16384, 65536) for t in (16, 64)]
    + [f"decode-int4/{b}/ctx{n}" for b in ("triton", "cuda") for n in (4096, 16384, 65536)]
)
FROZEN_CPU = [
    "cpu-verify/reference/ctx512/T4", "cpu-verify/reference/ctx512/T16",
    "cpu-verify/reference/ctx2048/T4", "cpu-verify/reference/ctx2048/T16",
    "cpu-decode/reference/ctx256", "cpu-tree/device/budget15",
]


def test_published_names_are_frozen():
    assert [w.name for w in W.gpu_workloads()] == FROZEN_GPU
    assert [w.name for w in W.cpu_workloads()] == FROZEN_CPU
    assert len({w.name for w in W.all_workloads()}) == len(FROZEN_GPU) + len(FROZEN_CPU)


def test_units_and_directions():
    assert W.find("verify/cuda/ctx65536/T16").unit == "seconds"
    assert W.find("verify/cuda/ctx65536/T16").direction == "lower"
    assert W.find("decode/triton/ctx4096").unit == "tok/s"
    assert W.find("decode/triton/ctx4096").direction == "higher"
    assert W.find("verify-nsplit/triton/ctx65536/T64/sauto").nsplit == "auto"
    with pytest.raises(ValueError, match="name"):
        W.find("verify/cuda/ctx65536/T17")


def test_gpu_workloads_skip_without_a_gpu():
    import torch

    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    assert W.unavailable_reason(W.find("verify/triton/ctx4096/T16")) == "needs a CUDA GPU"
    assert [w.device for w in W.default_workloads()] == ["cpu"] * len(FROZEN_CPU)


def test_sample_count_rules(monkeypatch):
    cpu = W.find("cpu-verify/reference/ctx512/T4")
    gpu = W.find("verify/cuda/ctx4096/T16")
    monkeypatch.delenv("KDENGINE_BENCH_SAMPLES", raising=False)
    assert W.sample_count(cpu) == W.CPU_SAMPLES and W.sample_count(cpu, quick=True) == W.CPU_QUICK_SAMPLES
    assert W.sample_count(gpu, quick=True) == W.GPU_VERIFY_SAMPLES >= 20
    monkeypatch.setenv("KDENGINE_BENCH_SAMPLES", "7")
    assert W.sample_count(cpu) == 7 and W.sample_count(cpu, samples=3) == 3
    monkeypatch.setenv("KDENGINE_BENCH_SAMPLES", "0")
    with pytest.raises(ValueError, match="KDENGINE_BENCH_SAMPLES"):
        W.sample_count(cpu)


def test_measure_cpu_verify_writes_one_record(tmp_path, monkeypatch):
    out = tmp_path / "s.jsonl"
    monkeypatch.setenv("KDENGINE_SAMPLES_OUT", str(out))
    monkeypatch.setenv("KDENGINE_CACHE_DIR", str(tmp_path))
    w = W.find("cpu-verify/reference/ctx512/T4")
    rec = W.measure_once(w, "run-a", samples=3)
    assert len(rec["samples"]) == 3 and rec["median"] > 0 and rec["unit"] == "seconds"
    assert rec["extra"]["roofline_pct"] > 0 and rec["fingerprint"]["machine"].startswith(("cpu-", "gpu-"))
    assert W.measure_once(w, "run-a", samples=3) == rec  # a second metric of the same run reuses it
    W.measure_once(w, "run-b", samples=3)  # another run measures again
    assert len(out.read_text().splitlines()) == 2


def test_tree_workload_measures_on_the_cpu(tmp_path, monkeypatch):
    """cpu-tree/device/budget15 times build_tree_device + mask: a time in seconds, lower is better."""
    monkeypatch.setenv("KDENGINE_SAMPLES_OUT", str(tmp_path / "s.jsonl"))
    w = W.find("cpu-tree/device/budget15")
    assert (w.unit, w.direction, w.T) == ("seconds", "lower", 16)
    rec = W.measure(w, samples=3, write=False)
    assert rec["unit"] == "seconds" and len(rec["samples"]) >= 3 and rec["median"] > 0
    assert rec["extra"]["budget"] == 15


def test_int4_decode_workloads():
    w = W.find("decode-int4/cuda/ctx65536")
    assert (w.kind, w.weights, w.unit, w.direction, w.context) == ("decode", "int4", "tok/s", "higher", 65536)
    assert W.find("decode/cuda/ctx65536").weights == "dense"


def test_workload_names_are_checked_where_workloads_are_made():
    made = W.all_workloads() + W.cpu_workloads()  # constructing each one ran the check
    assert {w.name for w in made} == set(FROZEN_GPU) | set(FROZEN_CPU)
    with pytest.raises(ValueError, match=r"^name: .*'<>'"):
        W.Workload("verify/<script>/ctx1/T1", "verify", "reference", 1, "cpu", 1)
    with pytest.raises(ValueError, match=r"^name: "):
        W.verify_workload("triton extend", 4096, 16)
