"""The decode run harness: settings, the engine built on a synthetic context, timed steps, the per-phase
and per-op profile with the step's memory floor, and (under TP) every rank's profile. run_decode() is the
measured benchmark entry point; the step itself lives in kdengine.engine.step, the process group in
kdengine.engine.parallel.

run_decode sets up a synthetic long context quickly: the KV pages (and the drafter's context cache)
are filled with random latent rows directly, with no prefill forward over the context. tok/s counts
accepted + bonus tokens over the timed steps for the layers actually run (never extrapolated).

Profile of a result (DecodeResult.profile(), also in the decode benchmark record's extra dict):
  phase_ms  mean ms per step of each phase (profiler.PHASES); under graphs the verify split (attention /
            MoE / other) comes from replays of a verify graph with its op events captured inside, less
            the events' own cost (split_graph_phases; the cost per event node is in the notes)
  op_ms     the ops inside "other" (profiler.OTHER_OPS + other-rest), measured the same way
  moe_op_ms the parts of verify-moe (profiler.MOE_OPS + moe-rest), measured the same way
  step_ms, floor_ms, step_over_floor, step_bytes, floor_ms_by_part: the step roofline (bytes the step
            reads: weights it touches, KV, drafter; over the measured copy bandwidth, read + write counted),
            and each part's share of the floor (weights ~ other + dense, experts ~ verify-moe, kv ~
            verify-attention, drafter_* ~ draft) to say what bounds the rest
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field

import torch

from kdengine.engine import moe, parallel
from kdengine.engine.accept import ReplayPolicy
from kdengine.engine.config import ModelConfig
from kdengine.engine.graphs import choose_expert_impl
from kdengine.engine.kv_cache import D_QK
from kdengine.engine.profiler import OTHER_REST, Profiler, event_overhead_ms
from kdengine.engine.step import (
    Engine,
    capture_graphs,
    fill_synthetic_context,
    profile_verify_in_graph,
    release_graphs,
    setup_engine,
    speculative_step,
)

resolve_device = parallel.resolve_device  # kept importable from here (and from generate)


@dataclass
class DecodeSettings:
    config: str = "kimi-k2-tp8-rank"
    layers: int | None = None  # None: the config's default (8 for kimi-k2-tp8-rank)
    context: int = 65536
    budget: int = 63
    backend: str = "auto"
    steps: int = 64
    warmup_steps: int = 4
    device: str = "auto"  # auto = cuda when available, else cpu
    seed: int = 0
    acceptance: str = "replay"  # replay | greedy
    mean_accept: float = 5.0  # replay: mean tokens per step (accepted + bonus)
    cuda_graphs: bool = True
    batch: int = 1
    tp: int = 1  # tensor-parallel processes (> 1: launched by torchrun, or a process group already up)
    weights: str = "dense"  # routed experts: dense (config dtype) | int4 (W4A16, random INT4 init)
    routing: str = "random"  # MoE routing policy: random | uniform | skewed[:imbalance] (engine/moe.py)


@dataclass
class DecodeResult:
    settings: DecodeSettings
    tok_per_s: float
    step_times_s: list[float]
    tokens_per_step: list[int]
    mean_accept: float
    phase_ms: dict[str, float]
    moe_load: list[float]
    moe_imbalance: float
    policy: str
    layers: int
    backend: str
    device: str = ""
    cuda_graphs_used: bool = False
    expert_impl: str = ""
    notes: list[str] = field(default_factory=list)
    per_rank: list[dict] = field(default_factory=list)  # TP: each rank's phases and expert load
    moe_rank_imbalance: float = 0.0  # TP: max/mean over ranks of the tokens routed to each rank
    all_reduce_ms: float = 0.0  # TP: this rank's collectives per step (inside phase_ms, not added)
    all_reduce_share: float = 0.0  # TP: all_reduce_ms / mean step time
    rank_imbalance: dict = field(default_factory=dict)  # TP: parallel.summarize_ranks (max/mean per metric)
    op_ms: dict[str, float] = field(default_factory=dict)  # the ops of "other" (profiler.OTHER_OPS)
    moe_op_ms: dict[str, float] = field(default_factory=dict)  # the parts of verify-moe (profiler.MOE_OPS)
    step_bytes: dict[str, int] = field(default_factory=dict)  # what one step reads, by part
    floor_ms: float = 0.0  # sum(step_bytes) / measured copy bandwidth
    copy_bytes_per_s: float = 0.0  # the measured copy bandwidth (read + write counted) behind floor_ms
    experts_touched: float = 0.0  # local experts with a token per step, summed over MoE layers
    routing: str = "random"  # the MoE routing policy the result was measured under
    moe: dict = field(default_factory=dict)  # moe.moe_report: bytes read per step, share of the step, GB/s
    peak_mem_gib: float = 0.0  # torch.cuda.max_memory_allocated after the run (0 on the CPU)
    host_step_ms: float = 0.0  # mean host time to issue one timed step (close to the step time: host-bound)

    @property
    def mean_step_ms(self) -> float:
        return 1e3 * sum(self.step_times_s) / max(len(self.step_times_s), 1)

    def profile(self) -> dict:
        """The per-phase and per-op profile and the step roofline (what attribution compares)."""
        step = self.mean_step_ms
        return {
            "phase_ms": dict(self.phase_ms), "op_ms": dict(self.op_ms), "moe_op_ms": dict(self.moe_op_ms), "step_ms": step, "floor_ms": self.floor_ms,
            "step_over_floor": step / self.floor_ms if self.floor_ms > 0 else 0.0, "step_bytes": dict(self.step_bytes),
            "floor_ms_by_part": {k: 1e3 * v / self.copy_bytes_per_s for k, v in self.step_bytes.items()} if self.copy_bytes_per_s else {},
            "experts_touched": self.experts_touched,
        }

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mean_step_ms"] = self.mean_step_ms
        d["step_over_floor"] = self.profile()["step_over_floor"]
        return d


def check_settings(s: DecodeSettings) -> None:
    if s.acceptance not in ("replay", "greedy"):
        raise ValueError(f"acceptance: expected 'replay' or 'greedy', got {s.acceptance!r}")
    for name in ("context", "steps", "batch", "budget", "tp"):
        if getattr(s, name) < 1:
            raise ValueError(f"{name}: expected >= 1, got {getattr(s, name)}")
    if s.warmup_steps < 0:
        raise ValueError(f"warmup_steps: expected >= 0, got {s.warmup_steps}")


# ---------------------------------------------------------------------------- build and time


def build_engine(s: DecodeSettings):
    """Config, engine with a synthetic context, and the acceptance policy for run_decode."""
    check_settings(s)
    overrides = {} if s.layers is None else {"n_layers": s.layers}
    overrides.update(expert_quant=moe.expert_quant_for(s.weights), routing=s.routing)
    cfg = ModelConfig.from_name(s.config, **overrides)
    group, device = parallel.join_group(s.tp, s.device)
    cfg = parallel.rank_config(cfg, group)
    T = s.budget + 1
    total_steps = s.warmup_steps + 2 * s.steps + 2
    max_tokens = s.context + total_steps * T + cfg.draft_block
    engine = setup_engine(cfg, device, s.batch, max_tokens, s.backend, s.seed, group)
    engine.model.set_expert_impl(moe.expert_impl_for(cfg, choose_expert_impl(cfg, device)))
    fill_synthetic_context(engine, s.context, s.seed)
    policy = ReplayPolicy(s.mean_accept, s.seed, cfg.draft_block + 1) if s.acceptance == "replay" else None
    return engine, policy


def timed_steps(engine: Engine, s: DecodeSettings, policy, prof: Profiler, n: int, progress=None, offset: int = 0,
                host: list | None = None):
    """n steps; per-step wall times (CUDA events or perf_counter) and tokens per step; `host` gets
    each step's host time (perf_counter around the step's launches: near the step time = host-bound)."""
    cuda = engine.cache.pool.device.type == "cuda"
    marks, tokens = [], []
    for i in range(n):
        t0 = time.perf_counter()
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            start = time.perf_counter()
        counts = speculative_step(engine, s.budget, policy, prof)[4]
        if cuda:
            end.record()
        else:
            end = time.perf_counter()
        marks.append((start, end))
        if host is not None:
            host.append(time.perf_counter() - t0)
        tokens.extend(counts)
        if progress is not None:
            progress(offset + i + 1, s.warmup_steps + s.steps)
    if cuda:
        torch.cuda.synchronize()
    times = [(a.elapsed_time(b) / 1e3) if cuda else (b - a) for a, b in marks]
    return times, tokens


def split_graph_phases(engine: Engine, s: DecodeSettings, policy, graph_phases: dict[str, float], notes: list[str]):
    """Graph steps time verify as one replay. Split it into attention / MoE / other, the ops of other
    and the parts of the MoE under replay: a verify graph with its op events captured inside
    (GraphOpTimer) runs a few steps. Its event nodes cost time of their own: two calibration steps
    give the cost of one (the op-timed verify beyond the timed replay's, over its event nodes), which
    is subtracted from every region that holds event nodes; other = the timed replay's verify less
    attention and MoE. Where that capture fails, eager steps give the split, scaled to the replayed
    verify (noted: launch gaps in it). Returns (phase_ms, op_ms, moe_op_ms, all-reduce ms per step)."""
    parts = ("verify-attention", "verify-moe", "other")
    n = min(4, s.steps)
    graph_verify = sum(graph_phases[k] for k in parts)
    dev = engine.cache.pool.device
    if not profile_verify_in_graph(engine, notes):
        release_graphs(engine)
        prof = Profiler(dev)
        timed_steps(engine, s, policy, prof, n)
        p = prof.phase_ms()
        eager_verify = sum(p[k] for k in parts)
        scale = graph_verify / eager_verify if eager_verify > 0 else 0.0
        notes.append(f"verify split (attention/moe/other, their ops) from {n} eager steps (the op-timed graph could "
                     f"not be captured: launch gaps included), scaled by {scale:.3f} to the timed replay's verify")
        scaled = lambda ops: {k: v * scale for k, v in ops.items()}  # noqa: E731
        return {**graph_phases, **{k: p[k] * scale for k in parts}}, scaled(prof.op_ms()), scaled(prof.moe_op_ms()), prof.comm_ms() * scale
    timer = engine.graphs["verify"].timer
    calib = Profiler(dev)
    timed_steps(engine, s, policy, calib, 2)
    profiled = calib.verify_ms()
    timer.overhead_ms = event_overhead_ms(profiled, graph_verify, len(timer.marks))
    prof = Profiler(dev)
    timed_steps(engine, s, policy, prof, n)
    p = prof.phase_ms()
    out = dict(graph_phases)
    out["verify-attention"], out["verify-moe"] = p["verify-attention"], p["verify-moe"]
    out["other"] = max(graph_verify - out["verify-attention"] - out["verify-moe"], 0.0)
    raw = sum(p[k] for k in parts)  # the op-timed verify less the nested regions' event nodes
    upper = p["other"] * graph_verify / raw if raw > 0 else 0.0
    ops = prof.op_ms()
    if ops:
        ops[OTHER_REST] = max(out["other"] - sum(v for k, v in ops.items() if k != OTHER_REST), 0.0)
    notes.append(f"verify split (attention/moe/other, their ops) from {n} replays of a verify graph with its op events "
                 f"captured inside; each event node's own cost, {1e3 * timer.overhead_ms:.2f} us (op-timed verify "
                 f"{profiled:.3f} ms vs {graph_verify:.3f} ms timed, {len(timer.marks)} event pairs), subtracted from "
                 f"the regions that hold it; other = the timed verify less attention and MoE (scaling every part "
                 f"by the timed / op-timed verify instead gives other {upper:.3f} ms: an upper bound, since other "
                 f"holds most of the event nodes)")
    return out, ops, prof.moe_op_ms(), prof.comm_ms()


# ---------------------------------------------------------------------------- step roofline


def param_bytes(module: torch.nn.Module, skip=()) -> int:
    return sum(p.numel() * p.element_size() for n, p in module.named_parameters() if not any(k in n for k in skip))


def step_bytes(engine: Engine, context: int, T: int, experts_touched: float) -> dict[str, int]:
    """Bytes one step reads at least once: target weights outside the routed experts (not the
    embedding table: T rows), the routed experts touched this step, each layer's latent KV of the
    context + tree, the drafter's weights (not its embedding) and its context K/V."""
    cfg, B = engine.cfg, engine.root.shape[0]
    E, n_moe = cfg.local_experts, cfg.n_layers - cfg.first_dense
    # routed experts: the per-expert tensors (leading dim E) of the MoE layers (modules with an expert path)
    routed = sum(p.numel() * p.element_size() for m in engine.model.modules() if hasattr(m, "impl")
                 for p in m.parameters(recurse=False) if p.dim() == 3 and p.shape[0] == E)
    per_expert = routed / max(E * n_moe, 1)
    d = engine.dcache
    return {
        "weights": int(param_bytes(engine.model, skip=("embed_tokens",)) - routed),
        "experts": int(experts_touched * per_expert),
        "kv": int(cfg.n_layers * B * (context + T) * D_QK * 2),
        "drafter_weights": int(param_bytes(engine.drafter, skip=("embed_tokens",))),
        "drafter_kv": int(2 * cfg.draft_layers * B * cfg.draft_heads * (context + cfg.draft_block) * cfg.draft_head_dim * d.k.element_size()),
    }


def touched_per_step(prof: Profiler) -> float:
    """Mean per step of (MoE layer, local expert) pairs with at least one token ([E] loads: one layer)."""
    if not prof.loads:
        return 0.0
    return float(sum(int((load > 0).sum()) for load in prof.loads) / len(prof.loads))


def copy_bandwidth(device: torch.device) -> float:
    from kdengine.bench.roofline import ceilings

    return ceilings(device).copy_bytes_per_s


# ---------------------------------------------------------------------------- the entry point


def run_decode(s: DecodeSettings, progress=None) -> DecodeResult:
    """Measure speculative decoding on a synthetic context (see the module docstring)."""
    engine, policy = build_engine(s)
    notes = [f"synthetic context: {s.context} tokens of random latent KV rows written directly (no prefill forward)"]
    graphs = capture_graphs(engine, s.budget, notes) if s.cuda_graphs else False
    notes.append("tree and mask: one build (timed as tree; mask is 0)")
    timed_steps(engine, s, policy, Profiler(engine.cache.pool.device, enabled=False), s.warmup_steps, progress)
    prof = Profiler(engine.cache.pool.device)
    host: list[float] = []
    times, tokens = timed_steps(engine, s, policy, prof, s.steps, progress, s.warmup_steps, host)
    phases, ops, moe_ops, comm = prof.phase_ms(), prof.op_ms(), prof.moe_op_ms(), prof.comm_ms()
    if graphs:
        phases, ops, moe_ops, comm = split_graph_phases(engine, s, policy, phases, notes)
    B, dev = s.batch, engine.cache.pool.device
    touched = touched_per_step(prof)
    nbytes = step_bytes(engine, s.context, s.budget + 1, touched)
    bandwidth = copy_bandwidth(dev)
    result = DecodeResult(
        settings=s,
        tok_per_s=sum(tokens) / max(sum(times), 1e-12),
        step_times_s=times,
        tokens_per_step=[sum(tokens[i : i + B]) for i in range(0, len(tokens), B)],
        mean_accept=sum(tokens) / max(len(tokens), 1),
        phase_ms=phases,
        moe_load=prof.moe_load(),
        moe_imbalance=prof.moe_imbalance(),
        policy=policy.name if policy is not None else "greedy",
        layers=engine.cfg.n_layers,
        backend=engine.backend,
        device=str(dev),
        cuda_graphs_used=bool(graphs),
        expert_impl=engine.model.layers[-1].mlp.impl if engine.cfg.n_layers > engine.cfg.first_dense else "",
        notes=notes,
        op_ms=ops,
        moe_op_ms=moe_ops,
        step_bytes=nbytes,
        floor_ms=1e3 * sum(nbytes.values()) / bandwidth,
        copy_bytes_per_s=bandwidth,
        experts_touched=touched,
        routing=engine.cfg.routing,
        moe=moe.moe_report(engine.cfg, touched, phases.get("verify-moe", 0.0), 1e3 * sum(times) / max(len(times), 1)),
        peak_mem_gib=torch.cuda.max_memory_allocated(dev) / 2**30 if dev.type == "cuda" else 0.0,
        host_step_ms=1e3 * sum(host) / max(len(host), 1),
    )
    if engine.group is not None:
        gather_ranks(result, engine, comm)
    return result


def gather_ranks(result: DecodeResult, engine: Engine, all_reduce_ms: float) -> None:
    """TP: check every rank committed the same tokens; every rank's phases, expert load and
    all-reduce time on every rank, and their imbalance across ranks (kdengine.engine.parallel)."""
    parallel.check_replicated(engine.group, root=engine.root, lengths=engine.cache.lengths)
    step_ms = result.mean_step_ms
    result.all_reduce_ms = all_reduce_ms
    result.all_reduce_share = all_reduce_ms / step_ms if step_ms > 0 else 0.0
    mine = {
        "rank": engine.cfg.tp_rank, "device": result.device, "tok_per_s": result.tok_per_s, "step_ms": step_ms,
        "phase_ms": result.phase_ms, "op_ms": result.op_ms,
        "moe_load": result.moe_load, "moe_imbalance": result.moe_imbalance,
        "all_reduce_ms": all_reduce_ms, "all_reduce_share": result.all_reduce_share,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if result.device.startswith("cuda") else 0.0,
    }
    result.per_rank = parallel.gather_profiles(mine, engine.group)
    result.rank_imbalance = parallel.summarize_ranks(result.per_rank)
    result.moe_rank_imbalance = result.rank_imbalance["moe_tokens"]
