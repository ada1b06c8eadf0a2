"""pytest-benchmark cases over this machine's verify workloads (the kdengine.bench core).

GPU: each round is one synchronised CUDA-graph replay of K launches (L2 flushed first), so the host
timer of pytest-benchmark times finished GPU work; the GPU event time per launch is kept in
extra_info. CPU: each round is one reference call on the tiny default sizes.
"""

from __future__ import annotations

import statistics

import pytest

from kdengine.bench import workloads as W

CASES = [w.name for w in W.default_workloads() if w.kind == "verify" and w.nsplit is None]


@pytest.mark.perf
@pytest.mark.parametrize("name", CASES)
def test_verify(benchmark, name):
    w = W.find(name)
    reason = W.unavailable_reason(w)
    if reason is not None:
        pytest.skip(reason)
    sample = W.verify_sampler(w)
    gpu_seconds = []

    def one_round():
        value = sample()
        if isinstance(value, float):
            gpu_seconds.append(value)

    rounds = W.sample_count(w)
    benchmark.pedantic(one_round, rounds=rounds, warmup_rounds=1, iterations=1)
    benchmark.extra_info.update(workload=name, unit="seconds", direction="lower")
    if gpu_seconds:
        benchmark.extra_info.update(gpu_median_s=statistics.median(gpu_seconds), gpu_samples_s=gpu_seconds)
