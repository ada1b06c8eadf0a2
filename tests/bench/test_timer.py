"""The CPU timer against a fake clock; argument checks; the GPU timer on a GPU."""

from __future__ import annotations

import pytest
import torch

from kdengine.bench import timer


class FakeClock:
    """Advances by the next of `steps` each time the timed function runs."""

    def __init__(self, steps):
        self.now, self.steps, self.calls = 0.0, list(steps), 0

    def __call__(self):
        return self.now

    def work(self):
        self.now += self.steps[self.calls % len(self.steps)]
        self.calls += 1


def test_cpu_timer_samples_follow_the_clock():
    clock = FakeClock([0.5, 3.0, 1.0, 2.0, 7.0])
    m = timer.time_cpu(clock.work, samples=4, warmup=1, clock=clock)
    assert m.samples == [3.0, 1.0, 2.0, 7.0]  # the warm-up call (0.5) is not a sample
    assert m.median == 2.5
    assert m.method == "perf_counter" and m.to_dict()["median"] == 2.5


def test_cpu_timer_divides_by_inner_calls():
    clock = FakeClock([1.0, 3.0])
    m = timer.time_cpu(clock.work, samples=3, warmup=0, inner=2, clock=clock)
    assert m.samples == [2.0, 2.0, 2.0]
    assert clock.calls == 6


@pytest.mark.parametrize("kwargs, name", [({"samples": 0}, "samples"), ({"warmup": -1}, "warmup"),
                                          ({"inner": 0}, "launches"), ({"samples": True}, "samples")])
def test_bad_counts_name_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        timer.time_cpu(lambda: None, **kwargs)


def test_gpu_timer_refuses_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("has a GPU")
    with pytest.raises(RuntimeError, match="no CUDA device"):
        timer.time_gpu(lambda i: None)


@pytest.mark.gpu
def test_gpu_timer_graph_and_flush():
    a = torch.randn(2048, 2048, device="cuda")
    small = timer.time_gpu(lambda i: a @ a, samples=5, launches=4, l2_flush=True)
    assert small.method == "cuda-graph" and len(small.samples) == timer.MIN_GPU_SAMPLES
    b = torch.randn(4096, 4096, device="cuda")
    big = timer.time_gpu(lambda i: b @ b, samples=20, launches=4)
    assert big.median > 2 * small.median  # 8x the FLOPs must show up in the time
    assert isinstance(big.throttled, bool)
