"""GPU-correct and CPU timers: every sample is the time of one launch, median and all samples kept.

GPU (`time_gpu`): warm-up launches, then the K launches of one sample are captured once in a CUDA
graph and each sample replays that graph between two CUDA events; no host sync per launch, one sync
at the end. Optionally an L2 flush (writing a buffer twice the L2 size) runs before each sample, for
workloads that would be cold in real use. Clocks and throttle reasons are read at the start and the
end; `throttled` marks a run that must not serve as a baseline. A launch that cannot be captured
falls back to eager launches between events (method "cuda-events").

CPU (`time_cpu`): perf_counter (or any injected clock) around `inner` calls per sample.

Harnesses that time a call with their own clock (pytest-benchmark) get `gpu_sampler` / `cpu_sampler`:
each call runs one finished sample and advances `SAMPLE_CLOCK` by that sample's measured time (CUDA
events on the GPU, so the L2 flush, the host sync and the harness's own overhead stay outside the
span). Give the harness `sample_clock` as its timer and its statistics are the same per-launch times
as `time_gpu`'s.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field

import torch

from kdengine.bench import fingerprint

MIN_GPU_SAMPLES = 20
DEFAULT_GPU_SAMPLES = 50
GAP_CLOCK_HZ = 2.0e9  # the SM clock a gap's spin cycles are counted at (nominal: ~1.98 GHz boost on the H200)


@dataclass
class Measurement:
    samples: list[float]  # seconds per launch, one value per sample
    method: str  # "cuda-graph", "cuda-events" or "perf_counter"
    launches_per_sample: int
    warmup: int
    l2_flush: bool = False
    clocks_start: dict = field(default_factory=dict)
    clocks_end: dict = field(default_factory=dict)
    throttled: bool = False
    unit: str = "seconds"

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    def to_dict(self) -> dict:
        return {**asdict(self), "median": self.median}


def _check_counts(samples: int, warmup: int, launches: int) -> None:
    for name, value, low in (("samples", samples, 1), ("warmup", warmup, 0), ("launches", launches, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise ValueError(f"{name}: expected an integer >= {low}, got {value!r}")


# --- a clock that advances by measured sample time -----------------------------------------------


class SampleClock:
    """Seconds of measured sample time so far: reading it costs nothing and it stands still between
    samples, so `clock() - clock()` around one sampler call is exactly that sample's time."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def __call__(self) -> float:
        return self.seconds

    def advance(self, seconds: float) -> float:
        if not seconds >= 0:
            raise ValueError(f"seconds: expected a time >= 0, got {seconds!r}")
        self.seconds += seconds
        return seconds


SAMPLE_CLOCK = SampleClock()


def sample_clock() -> float:
    """The process's sample clock (a plain function, so harnesses can name it: pytest-benchmark's
    `@pytest.mark.benchmark(timer=sample_clock)` or `--benchmark-timer kdengine.bench.timer.sample_clock`)."""
    return SAMPLE_CLOCK.seconds


# --- CPU ------------------------------------------------------------------------------------------


def time_cpu(
    fn: Callable[[], object],
    *,
    samples: int = 20,
    warmup: int = 1,
    inner: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> Measurement:
    """Call fn `warmup` times, then `samples` times `inner` calls timed by `clock` (seconds)."""
    _check_counts(samples, warmup, inner)
    for _ in range(warmup):
        fn()
    values = []
    for _ in range(samples):
        t0 = clock()
        for _ in range(inner):
            fn()
        values.append((clock() - t0) / inner)
    return Measurement(samples=values, method="perf_counter", launches_per_sample=inner, warmup=warmup)


def cpu_sampler(fn: Callable[[], object], *, inner: int = 1, clock: Callable[[], float] = time.perf_counter,
                advance: SampleClock = SAMPLE_CLOCK) -> Callable[[], float]:
    """A callable that runs `inner` calls of fn, advances `advance` by their mean time and returns it."""
    _check_counts(1, 0, inner)

    def sample() -> float:
        t0 = clock()
        for _ in range(inner):
            fn()
        return advance.advance((clock() - t0) / inner)

    return sample


# --- GPU ------------------------------------------------------------------------------------------


def _gap_cycles(gap_s: float) -> int:
    """The spin after a sample, in SM cycles at GAP_CLOCK_HZ (0: none); gap_s must be seconds >= 0."""
    if not gap_s >= 0:
        raise ValueError(f"gap_s: expected seconds >= 0, got {gap_s!r}")
    return int(gap_s * GAP_CLOCK_HZ)


def _spin(cycles: int) -> None:
    """One GPU thread busy for `cycles` (outside any events): the clock stays up while the power falls."""
    if cycles > 0:
        torch.cuda._sleep(cycles)


def l2_flush_buffer(device: torch.device) -> torch.Tensor:
    """A byte buffer twice the size of the device's L2 (at least 64 MiB); writing it evicts L2."""
    props = torch.cuda.get_device_properties(device)
    size = max(2 * int(getattr(props, "L2_cache_size", 0)), 64 * 2**20)
    return torch.empty(size, dtype=torch.uint8, device=device)


def _capture(launch: Callable[[int], object], launches: int, device: torch.device):
    """A CUDA graph of launch(0) .. launch(K-1), or None when the launches cannot be captured."""
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    try:
        with torch.cuda.stream(stream):  # a side-stream warm-up, as torch.cuda.graphs asks
            for i in range(launches):
                launch(i)
        torch.cuda.current_stream(device).wait_stream(stream)
        with torch.cuda.graph(graph, stream=stream):
            for i in range(launches):
                launch(i)
    except Exception:  # not capturable (host sync, allocation pattern): time eager launches instead
        torch.cuda.synchronize(device)
        return None
    torch.cuda.synchronize(device)
    return graph


def time_gpu(
    launch: Callable[[int], object],
    *,
    samples: int = DEFAULT_GPU_SAMPLES,
    warmup: int = 3,
    launches: int = 8,
    l2_flush: bool = False,
    use_graph: bool = True,
    device: torch.device | str | None = None,
    gap_s: float = 0.0,
) -> Measurement:
    """Time `launch(i)` (i = 0..launches-1 within a sample) on the GPU; seconds per launch.

    samples is raised to MIN_GPU_SAMPLES. `launch` must only enqueue work (no host sync) for the
    graph path; it may rotate input copies by i so a sample does not run from a warm L2. gap_s: as
    time_gpu_interleaved's.
    """
    return time_gpu_interleaved([launch], samples=samples, warmup=warmup, launches=launches, l2_flush=l2_flush,
                                use_graph=use_graph, device=device, gap_s=gap_s)[0]


def time_gpu_interleaved(
    launches_of: Sequence[Callable[[int], object]],
    *,
    samples: int = DEFAULT_GPU_SAMPLES,
    warmup: int = 3,
    launches: int = 8,
    l2_flush: bool = False,
    use_graph: bool = True,
    device: torch.device | str | None = None,
    gap_s: float = 0.0,
) -> list[Measurement]:
    """`time_gpu` of several launches at once, their samples interleaved: round s takes one sample of
    each, in an order rotated by s (each launch runs first, second, ... equally often), so a drift of
    the GPU's state over the run (clocks, power, temperature, what ran just before) falls on every
    launch alike instead of on whichever was timed last. One Measurement per launch, in order.

    Timed one after another on the H200, heavy launches (65k context, T=64) drove the GPU into its power
    cap partway through a set, so a row read 3-5% slower after the first (perf_history/kernel/order_2b9fdff/);
    ratios between launches timed here come from samples taken side by side.

    gap_s > 0: after each sample the GPU spins one thread for about that long (torch.cuda._sleep,
    cycles counted at GAP_CLOCK_HZ), outside the events: the GPU stays busy, so its clock does not
    park, while its power falls, so a power cap reached by back-to-back heavy samples can recover.
    """
    gap_cycles = _gap_cycles(gap_s)
    _check_counts(samples, warmup, launches)
    if not launches_of:
        raise ValueError("launches_of: expected at least one launch")
    if not torch.cuda.is_available():
        raise RuntimeError("time_gpu: no CUDA device")
    device = torch.device(device or "cuda")
    samples = max(samples, MIN_GPU_SAMPLES)
    graphs = []
    for launch in launches_of:
        for w in range(warmup):
            launch(w % launches)
        torch.cuda.synchronize(device)
        graphs.append(_capture(launch, launches, device) if use_graph else None)
    flush = l2_flush_buffer(device) if l2_flush else None
    count = len(launches_of)
    start = [[torch.cuda.Event(enable_timing=True) for _ in range(samples)] for _ in range(count)]
    end = [[torch.cuda.Event(enable_timing=True) for _ in range(samples)] for _ in range(count)]
    clocks_start = fingerprint.clocks(device.index)
    for s in range(samples):
        for k in range(count):
            j = (s + k) % count
            if flush is not None:
                flush.fill_(s & 0xFF)
            start[j][s].record()
            if graphs[j] is not None:
                graphs[j].replay()
            else:
                for i in range(launches):
                    launches_of[j](i)
            end[j][s].record()
            _spin(gap_cycles)
    torch.cuda.synchronize(device)
    clocks_end = fingerprint.clocks(device.index)
    throttled = fingerprint.throttled(clocks_start, clocks_end)
    return [
        Measurement(
            samples=[a.elapsed_time(b) / 1e3 / launches for a, b in zip(start[j], end[j], strict=True)],
            method="cuda-graph" if graphs[j] is not None else "cuda-events",
            launches_per_sample=launches,
            warmup=warmup,
            l2_flush=l2_flush,
            clocks_start=clocks_start,
            clocks_end=clocks_end,
            throttled=throttled,
        )
        for j in range(count)
    ]


def gpu_sampler(
    launch: Callable[[int], object],
    *,
    launches: int = 8,
    warmup: int = 3,
    l2_flush: bool = False,
    use_graph: bool = True,
    device: torch.device | str | None = None,
    advance: SampleClock = SAMPLE_CLOCK,
    gap_s: float = 0.0,
) -> Callable[[], float]:
    """A callable that runs one synchronised sample (graph replay of `launches` launches between
    events, after an optional L2 flush outside the events, then the gap_s spin of time_gpu_interleaved),
    advances `advance` by the GPU seconds per launch and returns them: the same sample as one of
    `time_gpu`'s."""
    _check_counts(1, warmup, launches)
    gap_cycles = _gap_cycles(gap_s)
    device = torch.device(device or "cuda")
    for w in range(warmup):
        launch(w % launches)
    torch.cuda.synchronize(device)
    graph = _capture(launch, launches, device) if use_graph else None
    flush = l2_flush_buffer(device) if l2_flush else None
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def sample() -> float:
        if flush is not None:
            flush.fill_(1)
        start.record()
        if graph is not None:
            graph.replay()
        else:
            for i in range(launches):
                launch(i)
        end.record()
        _spin(gap_cycles)
        end.synchronize()
        return advance.advance(start.elapsed_time(end) / 1e3 / launches)

    return sample
