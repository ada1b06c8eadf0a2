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


# --- the GPU timer's control flow, on a fake CUDA whose clock advances only with launched work -----


class FakeCuda:
    """Just enough of torch.cuda: a device clock advanced by launches, events that read it, and
    graphs that record launches at capture and re-run them at replay."""

    def __init__(self, capturable=True):
        self.clock_ms, self.capturing, self.recorded, self.capturable, self.syncs = 0.0, None, [], capturable, 0
        self.drift, self.gaps = 0.0, []
        fake = self

        class Event:
            def __init__(self, enable_timing=False):
                self.t = None

            def record(self):
                self.t = fake.clock_ms

            def synchronize(self):
                fake.syncs += 1

            def elapsed_time(self, other):
                return other.t - self.t

        class CUDAGraph:
            def __init__(self):
                self.launches = []

            def replay(self):
                for fn in self.launches:
                    fn()

        class GraphContext:
            def __init__(self, graph, stream=None):
                self.graph = graph

            def __enter__(self):
                fake.capturing = self.graph

            def __exit__(self, *exc):
                fake.capturing = None
                return False

        class Stream:
            def __init__(self, device=None):
                pass

            def wait_stream(self, other):
                pass

        self.Event, self.CUDAGraph, self.graph, self.Stream = Event, CUDAGraph, GraphContext, Stream

    def work(self, ms):
        """A launch of `ms` of device time: recorded while capturing, else run."""
        if self.capturing is not None:
            if not self.capturable:
                raise RuntimeError("operation not permitted when stream is capturing")
            self.capturing.launches.append(lambda: self.advance(ms))
        else:
            self.advance(ms)

    def advance(self, ms):
        self.clock_ms += ms * (1.0 + self.drift * self.clock_ms)  # drift > 0: the device slows as it runs

    def install(self, monkeypatch):
        import contextlib

        for name in ("Event", "CUDAGraph", "graph", "Stream"):
            monkeypatch.setattr(torch.cuda, name, getattr(self, name))
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: None)
        monkeypatch.setattr(torch.cuda, "current_stream", lambda device=None: self.Stream())
        monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
        monkeypatch.setattr(timer.fingerprint, "clocks", lambda index=None: {"sm_mhz": 1980, "throttle_mask": 0})
        monkeypatch.setattr(torch.cuda, "_sleep", lambda cycles: (self.gaps.append(cycles), self.work(cycles / 2e6)))
        flushes, fake = [], self

        class Flush:  # a flush costs 5 ms of device time, which must fall outside the sample's events
            def fill_(self, value):
                flushes.append(value)
                fake.work(5.0)

        monkeypatch.setattr(timer, "l2_flush_buffer", lambda device: Flush())
        return flushes


@pytest.mark.parametrize("capturable, method", [(True, "cuda-graph"), (False, "cuda-events")])
def test_gpu_timer_flow_on_a_fake_device(monkeypatch, capturable, method):
    fake = FakeCuda(capturable)
    flushes = fake.install(monkeypatch)
    cost_ms = [1.0, 3.0]  # launch i costs cost_ms[i % 2]: two rotating input copies
    m = timer.time_gpu(lambda i: fake.work(cost_ms[i % 2]), samples=5, launches=4, warmup=2, l2_flush=True,
                       device="cpu")
    assert m.method == method
    assert len(m.samples) == timer.MIN_GPU_SAMPLES  # raised to the minimum
    assert m.samples == pytest.approx([2e-3] * timer.MIN_GPU_SAMPLES)  # (1+3+1+3) ms / 4 launches, in s
    assert len(flushes) == timer.MIN_GPU_SAMPLES and m.throttled is False  # flush time is outside the events


def test_gpu_sampler_flow_on_a_fake_device(monkeypatch):
    fake = FakeCuda()
    fake.install(monkeypatch)
    sample = timer.gpu_sampler(lambda i: fake.work(2.0), launches=3, device="cpu")
    assert sample() == pytest.approx(2e-3) and fake.syncs == 1  # each sample waits for its own end event


def test_gpu_sampler_advances_the_sample_clock_by_event_time_only(monkeypatch):
    """The flush (5 ms of device time) and the host side fall outside: the clock moves by the
    events' time per launch, exactly what the sampler returns."""
    fake = FakeCuda()
    flushes = fake.install(monkeypatch)
    clock = timer.SampleClock()
    cost_ms = [1.0, 3.0]
    sample = timer.gpu_sampler(lambda i: fake.work(cost_ms[i % 2]), launches=4, l2_flush=True, device="cpu",
                               advance=clock)
    before = clock()
    values = [sample() for _ in range(3)]
    assert values == pytest.approx([2e-3] * 3) and len(flushes) == 3
    assert clock() - before == pytest.approx(6e-3)


def test_cpu_sampler_advances_the_sample_clock():
    fake = FakeClock([2.0, 4.0])
    clock = timer.SampleClock()
    sample = timer.cpu_sampler(fake.work, inner=2, clock=fake, advance=clock)
    assert sample() == 3.0 and clock() == 3.0
    assert clock() == clock()  # reading it costs nothing: it stands still between samples
    with pytest.raises(ValueError, match="seconds"):
        clock.advance(-1.0)


def test_sample_clock_is_a_named_function():
    """pytest-benchmark names its timer module.attr in saved runs and --benchmark-timer."""
    assert f"{timer.sample_clock.__module__}.{timer.sample_clock.__name__}" == "kdengine.bench.timer.sample_clock"
    start = timer.sample_clock()
    timer.SAMPLE_CLOCK.advance(0.25)
    assert timer.sample_clock() - start == 0.25


def test_interleaved_samples_put_a_drifting_device_on_every_launch_alike(monkeypatch):
    """Two identical launches on a device that slows as it runs: timed one after the other, the second
    reads slower (the position effect); interleaved, round by round in rotated order, they read alike."""
    fake = FakeCuda()
    fake.install(monkeypatch)
    fake.drift = 1e-3  # 0.1% slower per ms of device time so far
    same = lambda i: fake.work(1.0)  # noqa: E731
    first = timer.time_gpu(same, samples=20, launches=4, device="cpu")
    second = timer.time_gpu(same, samples=20, launches=4, device="cpu")
    assert second.median > 1.05 * first.median  # what sequential timing makes of an A/A pair
    fake.clock_ms = 0.0
    a, b = timer.time_gpu_interleaved([same, same], samples=20, launches=4, device="cpu")
    assert abs(a.median - b.median) < 0.005 * a.median
    assert len(a.samples) == len(b.samples) == timer.MIN_GPU_SAMPLES and a.method == b.method == "cuda-graph"


def test_interleaved_rounds_rotate_the_order_and_flush_before_every_sample(monkeypatch):
    fake = FakeCuda()
    flushes = fake.install(monkeypatch)
    cost = {"a": 1.0, "b": 2.0, "c": 4.0}  # ms of device time: the replayed work names its launch
    ms = timer.time_gpu_interleaved([lambda i, n=n: fake.work(cost[n]) for n in cost], samples=21, launches=1,
                                    warmup=0, l2_flush=True, device="cpu")
    assert [m.median for m in ms] == pytest.approx([1e-3, 2e-3, 4e-3])  # the flush falls outside the events
    assert all(len(m.samples) == 21 for m in ms) and len(flushes) == 3 * 21
    ran, advance = [], fake.advance
    fake.advance = lambda t: (ran.append(t), advance(t))  # the replays' order, flushes (5 ms) left out below
    timer.time_gpu_interleaved([lambda i, n=n: fake.work(cost[n]) for n in cost], samples=21, launches=1,
                               warmup=0, device="cpu")
    names = {v: k for k, v in cost.items()}
    replays = [names[t] for t in ran if t in names][-3 * 21:]  # capture warm-ups first, then the rounds
    rounds = [replays[k:k + 3] for k in range(0, len(replays), 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds)  # every round samples each launch once
    firsts = [r[0] for r in rounds]
    assert firsts.count("a") == firsts.count("b") == firsts.count("c") == 7  # and each goes first alike
    with pytest.raises(ValueError, match="launches_of"):
        timer.time_gpu_interleaved([], device="cpu")


def test_gaps_spin_after_every_sample_outside_the_events(monkeypatch):
    fake = FakeCuda()
    fake.install(monkeypatch)
    ms = timer.time_gpu_interleaved([lambda i: fake.work(1.0), lambda i: fake.work(2.0)], samples=20, launches=2,
                                    device="cpu", gap_s=0.004)
    assert [m.median for m in ms] == pytest.approx([1e-3, 2e-3])  # the 4 ms spins fall outside
    assert fake.gaps == [int(0.004 * timer.GAP_CLOCK_HZ)] * 40
    with pytest.raises(ValueError, match="gap_s"):
        timer.time_gpu_interleaved([lambda i: None], device="cpu", gap_s=-1.0)
