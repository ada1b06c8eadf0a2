"""The asv GPU decode cases run uniform routing under an explicit asv version (a new series: the names
stayed, the measured quantity changed); the CPU tiny decode stays on the router's routing (spec ==
plain greedy holds only for `random`). No GPU decode runs here: the settings builder is checked."""

from __future__ import annotations

import pytest
from asv_runner.discovery import _get_benchmark  # what `asv run` uses to build a benchmark

from benchmarks import bench_decode
from kdengine.bench import workloads as W

DECODE_METRICS = ["track_tok_per_s", "track_mean_accept", "track_attention_share", "track_step_over_floor"]


def asv_benchmark(klass, attr: str):
    return _get_benchmark(attr, bench_decode, klass, getattr(klass, attr))


@pytest.mark.parametrize("attr", DECODE_METRICS)
def test_decode_metrics_carry_the_uniform_routing_version(attr):
    b = asv_benchmark(bench_decode.Decode, attr)
    assert b.name == f"bench_decode.Decode.{attr}"
    assert b.version == bench_decode.Decode.version == "uniform-routing-1"


def test_other_decode_suites_keep_their_source_hash():
    """DecodeInt4 was uniform already and CpuDecode did not change: their series go on."""
    for klass, attr in [(bench_decode.DecodeInt4, "track_tok_per_s"), (bench_decode.CpuDecode, "track_tok_per_s")]:
        assert "version" not in vars(klass)
        assert len(asv_benchmark(klass, attr).version) == 64  # sha256 of the source


@pytest.mark.parametrize("backend", W.DECODE_BACKENDS)
@pytest.mark.parametrize("context", W.CONTEXTS)
def test_gpu_decode_settings_use_uniform_routing(backend, context):
    s = W.decode_settings(W.decode_workload(backend, context), steps=8)
    assert (s.routing, s.config, s.layers, s.weights, s.device) == ("uniform", "kimi-k2-tp8-rank", 8, "dense", "cuda")


def test_int4_uniform_cpu_random_and_decode_only():
    int4 = W.decode_settings(W.decode_int4_workload("cuda", 65536), steps=8)
    assert (int4.routing, int4.layers, int4.weights) == ("uniform", W.INT4_LAYERS, "int4")
    cpu = W.decode_settings(W.cpu_decode_workload(), steps=8)
    assert (cpu.routing, cpu.config, cpu.device) == ("random", "tiny", "cpu")
    with pytest.raises(ValueError, match="decode workload"):
        W.decode_settings(W.find("cpu-verify/reference/ctx512/T4"), steps=8)


def test_a_decode_record_names_its_routing(monkeypatch):
    monkeypatch.delenv("KDENGINE_SAMPLES_OUT", raising=False)
    rec = W.measure(W.cpu_decode_workload(), samples=2, write=False)
    assert rec["extra"]["routing"] == "random"
