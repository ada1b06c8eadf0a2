"""pytest-benchmark cases over this machine's verify workloads (the kdengine.bench core).

Each round runs one sample of the workload exactly as `kdengine bench` and asv take it (GPU: the L2
flushed, then a CUDA-graph replay of K launches between CUDA events; CPU: one reference call), and the
benchmark's timer is kdengine.bench.timer.sample_clock, which advances by that sample's measured time
per launch only: pytest-benchmark's statistics are GPU time, with the flush, the host sync and the
harness outside the timed span. So `--benchmark-compare-fail=median:5%` judges the same figures the
records hold. The GPU fp32 reference is left out here: it is the eager oracle (run-to-run spread 5-32%,
DESIGN), measured by asv and `kdengine bench`, not a kernel to compare at 5%.
"""

from __future__ import annotations

import pytest

from kdengine.bench import fingerprint, timer
from kdengine.bench import workloads as W

CASES = [w.name for w in W.default_workloads()
         if w.kind == "verify" and w.nsplit is None and not (w.device == "cuda" and w.backend == "reference")]


@pytest.mark.perf
@pytest.mark.benchmark(timer=timer.sample_clock)
@pytest.mark.parametrize("name", CASES)
def test_verify(benchmark, name):
    w = W.find(name)
    reason = W.unavailable_reason(w)
    if reason is not None:
        pytest.skip(reason)
    sample = W.verify_sampler(w)  # each call advances timer.SAMPLE_CLOCK by its measured seconds per launch
    benchmark.pedantic(sample, rounds=W.sample_count(w), warmup_rounds=1, iterations=1)
    benchmark.extra_info.update(workload=name, unit=w.unit, direction=w.direction,
                                timer="kdengine.bench.timer.sample_clock (CUDA events per launch on a GPU)",
                                clocks_end=fingerprint.clocks())
