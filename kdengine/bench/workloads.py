"""The benchmark workloads, by stable name, and how to measure one. History is keyed by these names:
never rename one (tests/bench/test_workloads.py holds the frozen list).

GPU names:  verify/<backend>/ctx<N>/T<T>                 one layer's verify call, H=8, seconds
            verify-nsplit/<backend>/ctx65536/T<T>/s<S>    the same at a forced KV split count S
            decode/<backend>/ctx<N>                       engine decode throughput, tok/s (uniform routing)
            tree/device/budget63                          DDTree build + ancestor mask, seconds
            verify-peer/<peer>/ctx<N>/T<T>                a peer (FlashMLA) on the verify shapes, seconds
CPU names:  cpu-verify/reference/ctx<N>/T<T>, cpu-decode/reference/ctx256, cpu-tree/device/budget15
            (the embedded tiny default,
            small enough that the whole suite runs on a laptop in well under two minutes).
`measure(workload)` returns one record (kdengine.bench.samples.make_record) and appends it to the
KDENGINE_SAMPLES_OUT file when that is set.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from kdengine import env
from kdengine.bench import fingerprint, names, peers, roofline, timer, verify_timing
from kdengine.bench import samples as sidecar

CONTEXTS = (4096, 16384, 65536)
TREE_SIZES = (16, 64)
HEADS = 8
VERIFY_BACKENDS = ("reference", "triton", "triton_extend", "cuda")
NSPLIT_BACKENDS = ("cuda", "triton")
NSPLIT_CONTEXT = 65536
NSPLITS = (16, 32, 64, 128, 256, "auto")
DECODE_BACKENDS = ("triton_extend", "triton", "cuda")
DECODE_INT4_BACKENDS = ("triton", "cuda")
INT4_LAYERS = 61  # the whole rank: fits one H200 with INT4 experts
CPU_CONTEXTS = (512, 2048)
CPU_TREE_SIZES = (4, 16)
CPU_DECODE_CONTEXT = 256
TREE_BUDGET, TREE_DEPTH, TREE_TOP_K = 63, 16, 8  # kimi-k2-tp8-rank drafter: block of 16, top-8
CPU_TREE_BUDGET, CPU_TREE_TOP_K = 15, 4  # tiny
PEER_BACKENDS = peers.PEERS

GPU_VERIFY_SAMPLES = 50
CPU_SAMPLES, CPU_QUICK_SAMPLES = 20, 5
GPU_DECODE_STEPS = 64
CPU_DECODE_STEPS, CPU_QUICK_DECODE_STEPS = 16, 8


@dataclass(frozen=True)
class Workload:
    name: str
    kind: str  # "verify", "decode" or "tree"
    backend: str
    context: int  # N: KV tokens a verify call reads (prefix N - T plus the T tree tokens); decode context
    device: str  # "cuda" or "cpu"
    T: int = 0  # tree tokens verified (verify only)
    H: int = HEADS
    nsplit: int | str | None = None  # forced KV split count (verify-nsplit only)
    weights: str = "dense"  # decode: routed experts dense (8 layers) or int4 (61 layers)
    routing: str = "random"  # decode: MoE routing policy (engine/moe.py): uniform on the GPU, random on the CPU

    def __post_init__(self):
        names.check_workload_name(self.name, "name")

    @property
    def unit(self) -> str:
        return "tok/s" if self.kind == "decode" else "seconds"

    @property
    def direction(self) -> str:
        return "higher" if self.kind == "decode" else "lower"


# --- the catalogue --------------------------------------------------------------------------------


def verify_workload(backend: str, context: int, T: int) -> Workload:
    return Workload(f"verify/{backend}/ctx{context}/T{T}", "verify", backend, context, "cuda", T)


def nsplit_workload(backend: str, T: int, nsplit: int | str) -> Workload:
    name = f"verify-nsplit/{backend}/ctx{NSPLIT_CONTEXT}/T{T}/s{nsplit}"
    return Workload(name, "verify", backend, NSPLIT_CONTEXT, "cuda", T, nsplit=nsplit)


def decode_workload(backend: str, context: int) -> Workload:
    """8 layers of kimi-k2-tp8-rank under uniform routing (random routing until the asv version
    uniform-routing-1 of bench_decode.Decode: same names, a new series)."""
    return Workload(f"decode/{backend}/ctx{context}", "decode", backend, context, "cuda", routing="uniform")


def decode_int4_workload(backend: str, context: int) -> Workload:
    """The whole 61-layer kimi-k2-tp8-rank with INT4 experts (W4A16) under uniform routing."""
    return Workload(f"decode-int4/{backend}/ctx{context}", "decode", backend, context, "cuda", weights="int4",
                    routing="uniform")


def cpu_verify_workload(context: int, T: int) -> Workload:
    return Workload(f"cpu-verify/reference/ctx{context}/T{T}", "verify", "reference", context, "cpu", T)


def cpu_decode_workload() -> Workload:
    """The tiny config on the router's own routing (spec == plain greedy holds only for `random`)."""
    return Workload(f"cpu-decode/reference/ctx{CPU_DECODE_CONTEXT}", "decode", "reference", CPU_DECODE_CONTEXT, "cpu")


def tree_workload(device: str = "cuda") -> Workload:
    """The draft tree and its mask from one drafter output (context does not enter: 0)."""
    if device == "cuda":
        return Workload(f"tree/device/budget{TREE_BUDGET}", "tree", "device", 0, "cuda", TREE_BUDGET + 1)
    return Workload(f"cpu-tree/device/budget{CPU_TREE_BUDGET}", "tree", "device", 0, "cpu", CPU_TREE_BUDGET + 1)


def peer_workload(peer: str, context: int, T: int) -> Workload:
    return Workload(f"verify-peer/{peer}/ctx{context}/T{T}", "verify", peer, context, "cuda", T)


def gpu_workloads() -> list[Workload]:
    verify = [verify_workload(b, n, t) for b in VERIFY_BACKENDS for n in CONTEXTS for t in TREE_SIZES]
    sweep = [nsplit_workload(b, t, s) for b in NSPLIT_BACKENDS for t in TREE_SIZES for s in NSPLITS]
    decode = [decode_workload(b, n) for b in DECODE_BACKENDS for n in CONTEXTS]
    peer = [peer_workload(p, n, t) for p in PEER_BACKENDS for n in CONTEXTS for t in TREE_SIZES]
    int4 = [decode_int4_workload(b, n) for b in DECODE_INT4_BACKENDS for n in CONTEXTS]
    return verify + sweep + decode + [tree_workload("cuda")] + peer + int4


def cpu_workloads() -> list[Workload]:
    verify = [cpu_verify_workload(n, t) for n in CPU_CONTEXTS for t in CPU_TREE_SIZES]
    return verify + [cpu_decode_workload(), tree_workload("cpu")]


def all_workloads() -> list[Workload]:
    return gpu_workloads() + cpu_workloads()


def default_workloads() -> list[Workload]:
    """The GPU suite on a machine with a GPU, the embedded CPU default without one."""
    return gpu_workloads() if torch.cuda.is_available() else cpu_workloads()


def find(name: str) -> Workload:
    for w in all_workloads():
        if w.name == name:
            return w
    raise ValueError(f"name: expected a published workload name (e.g. verify/triton/ctx65536/T16), got {name!r}")


# --- availability ---------------------------------------------------------------------------------


def _engine():
    from kdengine.engine import generate  # the engine lands separately; absent means skipped

    return generate


def unavailable_reason(w: Workload) -> str | None:
    """None when `w` can run here, else why not (no GPU, backend unavailable, engine missing, memory)."""
    if w.device == "cuda" and not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if w.kind == "tree":
        try:
            _engine()
        except ImportError as exc:
            return f"the engine is not importable ({exc})"
        return None
    from kdengine.ops.verify import unavailable_reason as backend_reason

    reason = peers.unavailable_reason(w.backend, w.device) if w.backend in PEER_BACKENDS else backend_reason(w.backend, w.device)
    if reason is not None:
        return reason
    if w.kind == "decode":
        try:
            _engine()
        except ImportError as exc:
            return f"the engine is not importable ({exc})"
    elif w.device == "cuda":
        free, _ = torch.cuda.mem_get_info()
        need = 4 * roofline.verify_bytes(N=w.context, T=w.T, H=w.H) + (256 << 20)
        if free < need:
            return f"needs ~{need >> 20} MiB of free GPU memory, {free >> 20} MiB free"
    return None


def sample_count(w: Workload, samples: int | None = None, quick: bool = False) -> int:
    """Samples (verify) or timed steps (decode): the argument, else KDENGINE_BENCH_SAMPLES, else the
    default (fewer on the CPU under asv --quick)."""
    chosen = samples if samples is not None else env.bench_samples()
    if chosen is not None:
        return chosen
    if w.device == "cpu":
        if w.kind == "decode":
            return CPU_QUICK_DECODE_STEPS if quick else CPU_DECODE_STEPS
        return CPU_QUICK_SAMPLES if quick else CPU_SAMPLES
    return GPU_DECODE_STEPS if w.kind == "decode" else GPU_VERIFY_SAMPLES


def _measure_tree(w: Workload, n_samples: int) -> tuple[timer.Measurement, dict]:
    """The DDTree + its packed ancestor mask from random drafter top-k log-probs [1, L, K], as the
    engine's step builds them (tree.tree_and_mask: one Triton kernel where it runs; captured in a
    CUDA graph on the GPU; hot inputs: the drafter just wrote them)."""
    from kdengine.engine.tree import tree_and_mask

    budget = w.T - 1
    K = TREE_TOP_K if w.device == "cuda" else CPU_TREE_TOP_K
    gen = torch.Generator().manual_seed(0)
    lp = torch.randn(1, TREE_DEPTH, K, generator=gen).log_softmax(-1).sort(-1, descending=True).values.to(w.device)
    ids = torch.randint(0, 32000, (1, TREE_DEPTH, K), generator=gen).to(w.device)
    root = torch.zeros(1, dtype=torch.int64, device=w.device)

    def call(_i=0):
        return tree_and_mask(lp, ids, budget, root)

    if w.device == "cpu":
        return timer.time_cpu(call, samples=n_samples, warmup=2), {"budget": budget, "top_k": K}
    m = timer.time_gpu(call, samples=n_samples, warmup=3, launches=8, l2_flush=False, use_graph=True)
    return m, {"budget": budget, "top_k": K, "depth": TREE_DEPTH, "target_s": 2e-4}


# --- measuring ------------------------------------------------------------------------------------


def _verify_sets(w: Workload) -> list:
    """The input sets one sample rotates through (kdengine.bench.verify_timing: context N = every KV
    token the call reads, N - T committed tokens plus the T tree tokens)."""
    return verify_timing.input_sets(N=w.context, T=w.T, H=w.H, device=w.device)


def _capturable(w: Workload) -> bool:
    """The torch reference reads prefix_len on the host (no graph): it is timed as eager launches
    between events (method "cuda-events"); the kernel backends are graph-safe by contract."""
    return w.backend != "reference"


def _verify_call(w: Workload):
    if w.backend in PEER_BACKENDS:
        return peers.verify_call(w.backend)
    return verify_timing.suite_call(w.backend, w.nsplit)


def verify_sampler(w: Workload):
    """A callable running one finished sample of verify workload `w` (for pytest-benchmark): on the
    GPU a synchronised graph replay that returns GPU seconds per launch, on the CPU one call."""
    if w.kind != "verify":
        raise ValueError(f"w: expected a verify workload, got {w.name}")
    return verify_timing.sampler(_verify_call(w), _verify_sets(w), capturable=_capturable(w))


def _measure_verify(w: Workload, n_samples: int) -> tuple[timer.Measurement, dict]:
    sets = _verify_sets(w)
    m = verify_timing.time_verify(_verify_call(w), sets, samples=n_samples, capturable=_capturable(w))
    return m, {"copies": len(sets)}


def decode_settings(w: Workload, steps: int):
    """The engine's DecodeSettings for decode workload `w` timed over `steps` steps."""
    if w.kind != "decode":
        raise ValueError(f"w: expected a decode workload, got {w.name}")
    on_gpu = w.device == "cuda"
    return _engine().DecodeSettings(
        config="kimi-k2-tp8-rank" if on_gpu else "tiny", layers=(INT4_LAYERS if w.weights == "int4" else 8) if on_gpu else 2,
        context=w.context, weights=w.weights, routing=w.routing,
        budget=63 if on_gpu else 7, backend=w.backend, steps=steps, warmup_steps=4 if on_gpu else 2,
        device=w.device, seed=0, acceptance="replay", mean_accept=5.0 if on_gpu else 3.0,
        cuda_graphs=on_gpu, batch=1,
    )


def _measure_decode(w: Workload, steps: int) -> tuple[timer.Measurement, dict]:
    gen = _engine()
    on_gpu = w.device == "cuda"
    settings = decode_settings(w, steps)
    clocks_start = fingerprint.clocks() if on_gpu else {}
    r = gen.run_decode(settings, progress=None)
    clocks_end = fingerprint.clocks() if on_gpu else {}
    # tok/s per step at the run's mean tokens per step: the samples vary with time alone, since the
    # seeded acceptance replay makes the tokens of each step the same from run to run
    mean_tokens = statistics.fmean(r.tokens_per_step)
    values = [mean_tokens / t for t in r.step_times_s]
    m = timer.Measurement(samples=values, method="engine-steps", launches_per_sample=1,
                          warmup=settings.warmup_steps, clocks_start=clocks_start, clocks_end=clocks_end,
                          throttled=fingerprint.throttled(clocks_start, clocks_end), unit="tok/s")
    total = sum(r.phase_ms.values()) or 1.0
    extra = {
        "tok_per_s": r.tok_per_s, "mean_accept": r.mean_accept, "phase_ms": dict(r.phase_ms),
        "phase_share": {k: v / total for k, v in r.phase_ms.items()}, "moe_imbalance": r.moe_imbalance,
        "policy": r.policy, "engine_backend": r.backend, "steps": steps,
        "cuda_graphs_used": getattr(r, "cuda_graphs_used", None), "notes": list(getattr(r, "notes", [])),
        "settings": {k: getattr(settings, k) for k in ("config", "layers", "budget", "mean_accept", "acceptance")},
    }
    extra.update({"weights": w.weights, "routing": r.routing, "moe": dict(r.moe), "peak_mem_gib": r.peak_mem_gib})
    extra.update(r.profile())  # phase_ms, op_ms, step_ms, floor_ms, step_over_floor, step_bytes (profiler.attribute)
    return m, extra


def _run_fingerprint(m: timer.Measurement) -> dict:
    return {**fingerprint.collect(), "machine": fingerprint.machine_name(), "clocks_start": m.clocks_start,
            "clocks_end": m.clocks_end, "throttled": m.throttled}


def measure(w: Workload, *, samples: int | None = None, quick: bool = False, asv_name: str | None = None,
            asv_params: list[str] | None = None, write: bool = True, run: str | None = None) -> dict:
    """Measure `w` once; the record (samples, median, unit, direction, extra, fingerprint).

    `run` tags the record with the run that made it (see measure_once). Raises RuntimeError with
    the reason when `w` cannot run here.
    """
    reason = unavailable_reason(w)
    if reason is not None:
        raise RuntimeError(f"{w.name}: {reason}")
    n = sample_count(w, samples, quick)
    if w.kind == "verify":
        m, extra = _measure_verify(w, n)
        ceil = roofline.ceilings(w.device)
        extra.update(roofline.verify_roofline(m.median, N=w.context, T=w.T, H=w.H, ceil=ceil))
        extra.update({"nsplit": w.nsplit, "N": w.context, "T": w.T, "H": w.H})
    elif w.kind == "tree":
        m, extra = _measure_tree(w, n)
    else:
        m, extra = _measure_decode(w, n)
    extra.update({"method": m.method, "launches_per_sample": m.launches_per_sample, "l2_flush": m.l2_flush})
    record = sidecar.make_record(
        name=w.name, unit=w.unit, direction=w.direction, median=m.median, samples=m.samples,
        throttled=m.throttled, fingerprint=_run_fingerprint(m), asv_name=asv_name, asv_params=asv_params,
        extra=extra, run=run,
    )
    if write:
        sidecar.append_record(record)
    return record


def measure_once(w: Workload, run: str, **kwargs) -> dict:
    """The record of `w` that run `run` already wrote to KDENGINE_SAMPLES_OUT, else `measure(w)`:
    several asv track_ metrics of one workload share one measurement within one asv run."""
    found = sidecar.find_record(w.name, run)
    return found if found is not None else measure(w, run=run, **kwargs)
