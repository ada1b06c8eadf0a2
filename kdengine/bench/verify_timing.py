"""How one verify call is timed, for every front end: the workload suite (asv, pytest-benchmark,
`kdengine bench`) and the kernel sweep (kdengine.bench.kernel) build the same input sets and time them
the same way, so they report the same figures.

GPU: `copies` distinct input sets (so the KV of consecutive launches exceeds twice the L2: each layer
of a real model reads its own cold KV), K = max(8, copies) launches rotating through them captured in
one CUDA graph, the L2 flushed before each sample, CUDA events around each replay, seconds per launch
(kdengine.bench.timer.time_gpu). CPU: one input set, perf_counter around each call. Several calls timed
together (the kernel sweep's rows of one size) take their samples interleaved, round by round.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from kdengine.bench import roofline, timer

MIN_LAUNCHES = 8
MAX_COPIES = 32
# The GPU spins this long after every sample (kdengine.bench.timer.time_gpu_interleaved's gap): busy, so its
# clock does not park, at low power, so the power cap that back-to-back heavy samples reach stays off. On the
# H200 at 65k T=64, without it every row after the first spent 100% of its span under sw_power_cap and read
# 3-5% slower than the first; with 1, 4 or 16 ms none was capped, the clock ended at 1980 MHz and five runs
# agreed within 1% on every row (perf_history/kernel/order_2b9fdff/, order_e8ba5e7/summary.txt).
GAP_S = 0.004
# The method's name in a GPU run's fingerprint ("verify_timer"): ci/history compares only runs that agree on it
# (GPU runs recorded before it existed timed samples back to back: "back-to-back").
METHOD = f"gap{GAP_S * 1e3:g}ms"

# call(inp, bits) -> out: one verify launch on one input set (inp: kdengine.ops.inputs.VerifyInputs,
# bits: its packed tree mask)
VerifyCall = Callable[[object, torch.Tensor], object]


def suite_call(backend: str, nsplit: int | str | None = None) -> VerifyCall:
    """The call verify/<backend>/... times (asv, pytest-benchmark, `kdengine bench`) and the kernel sweep's
    dispatched row: verify_attention on one input set, its output not kept (one function, so the front ends differ
    only in their input sets' placement: ci/gpu/frontends.py)."""
    from kdengine.ops.verify import verify_attention

    def call(inp, bits):
        return verify_attention(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, sm_scale=inp.sm_scale,
                                nsplit=nsplit, backend=backend)

    return call


def input_copies(*, N: int, T: int, H: int, device: str | torch.device = "cuda") -> int:
    """Input sets a GPU sample rotates through: enough that their KV exceeds twice the L2."""
    if torch.device(device).type != "cuda":
        return 1
    l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0)) or (64 << 20)
    return max(1, min(MAX_COPIES, math.ceil(2 * l2 / roofline.verify_bytes(N=N, T=T, H=H))))


def make_inputs(*, N: int, T: int, H: int, seed: int, device: str | torch.device, chain: bool = False):
    """One problem of context N (N - T committed tokens, then the T tree tokens): (inputs, packed mask)."""
    from kdengine.ops.inputs import make_verify_inputs
    from kdengine.ops.mask import pack_tree_mask

    inp = make_verify_inputs(B=1, T=T, H=H, prefix=N - T, seed=seed, device=device, chain=chain)
    return inp, pack_tree_mask(inp.tree_mask)


def input_sets(*, N: int, T: int, H: int, device: str | torch.device = "cuda", chain: bool = False) -> list:
    return [make_inputs(N=N, T=T, H=H, seed=i, device=device, chain=chain)
            for i in range(input_copies(N=N, T=T, H=H, device=device))]


def _rotating(call: VerifyCall, sets: list) -> Callable[[int], object]:
    return lambda i: call(*sets[i % len(sets)])


def time_verify(call: VerifyCall, sets: list, *, samples: int, capturable: bool = True,
                gap_s: float = GAP_S) -> timer.Measurement:
    """Seconds per launch of `call` over `sets` (see the module docstring)."""
    return time_verify_many([(call, sets)], samples=samples, capturable=capturable, gap_s=gap_s)[0]


def time_verify_many(calls: list[tuple[VerifyCall, list]], *, samples: int, capturable: bool = True,
                     gap_s: float = GAP_S, launches: int | None = None) -> list[timer.Measurement]:
    """`time_verify` of each (call, sets), on the GPU with their samples interleaved round by round
    (kdengine.bench.timer.time_gpu_interleaved): the figures of calls compared with each other come from
    samples taken side by side (gap_s: timer.time_gpu_interleaved's). On the CPU one after another.
    launches: per graph replay (None: the module's K = max(MIN_LAUNCHES, sets); 1: one call per replay, a probe's
    second form)."""
    if not calls:
        raise ValueError("calls: expected at least one (call, sets)")
    if calls[0][1][0][0].q.device.type != "cuda":
        return [timer.time_cpu(lambda c=call, s=sets: c(*s[0]), samples=samples, warmup=1) for call, sets in calls]
    launches = launches or max(MIN_LAUNCHES, *(len(sets) for _, sets in calls))
    return timer.time_gpu_interleaved([_rotating(call, sets) for call, sets in calls], samples=samples, warmup=3,
                                      launches=launches, l2_flush=True, use_graph=capturable, gap_s=gap_s)


def sampler(call: VerifyCall, sets: list, *, capturable: bool = True) -> Callable[[], float]:
    """One sample of `time_verify` per call, advancing kdengine.bench.timer.SAMPLE_CLOCK by it."""
    inp, _ = sets[0]
    if inp.q.device.type != "cuda":
        return timer.cpu_sampler(lambda: call(*sets[0]))
    return timer.gpu_sampler(_rotating(call, sets), launches=max(MIN_LAUNCHES, len(sets)), l2_flush=True, gap_s=GAP_S,
                             use_graph=capturable)
