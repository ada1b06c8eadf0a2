"""The decode loop: prefill, then per step draft -> tree -> mask -> verify -> accept -> commit, as small
functions over an Engine; plain greedy decoding (the lossless oracle); run_decode(), the measured
benchmark entry point. The engine knows nothing about tokenization.

run_decode sets up a synthetic long context quickly: the KV pages (and the drafter's context cache)
are filled with random latent rows directly, with no prefill forward over the context. tok/s counts
accepted + bonus tokens over the timed steps for the layers actually run (never extrapolated).

Letters: B batch, T = budget + 1 tree tokens, L drafter block, K top-k per position.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch

from kdengine.engine.accept import ReplayPolicy, accept_greedy, accept_replay, accepted_tokens
from kdengine.engine.config import ModelConfig
from kdengine.engine.drafter import DraftCache, Drafter, append_context, draft_block
from kdengine.engine.kv_cache import PagedKVCache
from kdengine.engine.model import Step, Transformer, torch_dtype
from kdengine.engine.profiler import VERIFY, Profiler
from kdengine.engine.tree import DraftTree, build_masks, build_tree_device
from kdengine.engine.weights import materialize
from kdengine.ops.mask import pack_tree_mask
from kdengine.ops.verify import select_backend

PREFILL_CHUNK = 128


@dataclass
class Engine:
    cfg: ModelConfig
    model: Transformer
    drafter: Drafter
    cache: PagedKVCache
    dcache: DraftCache
    backend: str
    root: torch.Tensor  # [B] int64: the last accepted token, not yet in the KV cache
    host_len: list[int]  # committed tokens per sequence, host mirror of cache.lengths
    group: object = None  # torch.distributed process group for TP (None: one process)
    draft_fn: Callable | None = None  # override of the drafter (tests): engine -> (log_probs, ids)
    verify_fn: Callable | None = None  # set by graphs.py: (tokens, positions, mask_bits) -> outputs
    draft_graph: Callable | None = None  # set by graphs.py: engine -> (log_probs, ids)
    tree_graph: Callable | None = None  # set by graphs.py: (log_probs, ids, root) -> (tokens, parents, depths)
    mask_graph: Callable | None = None  # set by graphs.py: parents -> (mask, bits)


def setup_engine(cfg: ModelConfig, device, batch: int, max_tokens: int, backend: str = "auto", seed: int = 0, group=None) -> Engine:
    """Random weights on `device`, a KV pool for batch sequences of up to max_tokens, drafter cache."""
    device = torch.device(device)
    model = materialize(Transformer, cfg, device, seed)
    drafter = materialize(Drafter, cfg, device, seed + 1)
    pages = -(-max_tokens // cfg.page_size)
    cache = PagedKVCache(cfg.n_layers, batch * pages + 1, cfg.page_size, batch, pages, device)
    capacity = -(-(max_tokens + cfg.draft_block) // 64) * 64  # aligned rows suit the fused SDPA kernels
    dcache = DraftCache(cfg, batch, capacity, device, torch_dtype(cfg.dtype))
    root = torch.zeros(batch, dtype=torch.int64, device=device)
    return Engine(cfg, model, drafter, cache, dcache, select_backend(backend, device), root, [0] * batch, group)


# ---------------------------------------------------------------------------- context


def forward(engine: Engine, tokens, positions, mask_bits, timer=None):
    """Target forward of tokens [B, T] at the cache's current lengths -> (greedy [B, T], features, load)."""
    step = Step(engine.cfg, engine.cache, mask_bits, engine.backend, engine.group)
    greedy, feats = engine.model(tokens, positions, step, timer)
    return greedy, feats, step.expert_load


def chain_bits(B: int, T: int, device) -> torch.Tensor:
    return pack_tree_mask(torch.ones(T, T, dtype=torch.bool, device=device).tril().expand(B, T, T).contiguous())


def reserve(engine: Engine, extra: int) -> None:
    for b, n in enumerate(engine.host_len):
        engine.cache.ensure_capacity(b, n + extra)


def advance(engine: Engine, counts: list[int]) -> None:
    engine.host_len = [n + c for n, c in zip(engine.host_len, counts, strict=True)]


@torch.no_grad()
def prefill(engine: Engine, prompt: torch.Tensor) -> torch.Tensor:
    """Run prompt [B, N] through the target in chunks (causal), commit its KV and drafter context;
    the target's next token becomes the root. Returns the root [B]."""
    B, N = prompt.shape
    dev = engine.cache.pool.device
    for s in range(0, N, PREFILL_CHUNK):
        chunk = prompt[:, s : s + PREFILL_CHUNK].to(dev)
        T = chunk.shape[1]
        reserve(engine, T)
        positions = engine.cache.lengths[:, None].long() + torch.arange(T, device=dev)
        greedy, feats, _ = forward(engine, chunk, positions, chain_bits(B, T, dev))
        count = torch.full((B,), T, dtype=torch.int64, device=dev)
        append_context(engine.drafter, engine.dcache, feats, count)
        engine.cache.lengths += T
        advance(engine, [T] * B)
    engine.root = greedy[:, -1].clone()
    return engine.root


def fill_synthetic_context(engine: Engine, context: int, seed: int) -> None:
    """Random latent KV rows and drafter context for `context` tokens per sequence (no forward)."""
    gen = torch.Generator(device=engine.cache.pool.device).manual_seed(seed)
    for b in range(len(engine.host_len)):
        engine.cache.fill_random(b, context, gen)
    engine.dcache.fill_random(context, gen)
    engine.host_len = [context] * len(engine.host_len)
    engine.root = torch.randint(0, engine.cfg.vocab_size, engine.root.shape, generator=gen, device=engine.root.device)


# ---------------------------------------------------------------------------- one step


def draft(engine: Engine):
    """Top-K log-probs and ids per block position, [B, L, K] each."""
    if engine.draft_fn is not None:
        return engine.draft_fn(engine)
    if engine.draft_graph is not None:
        return engine.draft_graph(engine)
    return draft_block(engine.drafter, engine.dcache, engine.root)


def make_tree(engine: Engine, log_probs, ids, budget: int) -> DraftTree:
    if engine.tree_graph is not None:
        return DraftTree(*engine.tree_graph(log_probs, ids, engine.root), mask=None)
    return build_tree_device(log_probs, ids, budget, root_token=engine.root, with_mask=False)


def tree_mask_bits(parents: torch.Tensor):
    """Ancestor masks [B, T, T] and their packed form [B, T, W] from parents [B, T]."""
    mask = build_masks(parents)
    return mask, pack_tree_mask(mask)


def make_mask(engine: Engine, tree: DraftTree) -> torch.Tensor:
    """Packed ancestor mask [B, T, W] of the tree (also stored on tree.mask)."""
    fn = engine.mask_graph or tree_mask_bits
    tree.mask, bits = fn(tree.parents)
    return bits


def verify(engine: Engine, tree: DraftTree, mask_bits, timer=None):
    """Write tree KV into the pages and run the target over the T tree tokens."""
    positions = engine.cache.lengths[:, None].long() + tree.depths
    if engine.verify_fn is not None:
        return engine.verify_fn(tree.tokens, positions, mask_bits)
    return forward(engine, tree.tokens, positions, mask_bits, timer)


def accept(engine: Engine, tree: DraftTree, target, policy):
    """(path, count, bonus, counts on the host) by the policy: None = greedy tree walk (one host
    sync for the counts), else a ReplayPolicy (counts known on the host: no sync)."""
    if policy is None:
        path, count, bonus = accept_greedy(tree.tokens, tree.parents, target, engine.cfg.draft_block)
        return path, count, bonus, count.tolist()
    counts = [min(c, tree.size) for c in policy.draw(target.shape[0])]
    return (*accept_replay(target, counts, tree.size), counts)


def commit(engine: Engine, path, count, bonus, features, counts_host: list[int]) -> None:
    """Keep the accepted KV rows (compacted after the prefix), extend the drafter context, new root."""
    engine.cache.compact(path, count)
    feats = features.gather(1, path[:, :, None].expand(-1, -1, features.shape[-1]))
    append_context(engine.drafter, engine.dcache, feats, count)
    engine.root = bonus
    advance(engine, counts_host)


@torch.no_grad()
def speculative_step(engine: Engine, budget: int, policy=None, prof: Profiler | None = None):
    """One step; returns (path, count, bonus, tree tokens, tokens per sequence on the host)."""
    prof = prof or Profiler(engine.cache.pool.device, enabled=False)
    reserve(engine, budget + 1)
    with prof.phase("draft"):
        log_probs, ids = draft(engine)
    with prof.phase("tree"):
        tree = make_tree(engine, log_probs, ids, budget)
    with prof.phase("mask"):
        bits = make_mask(engine, tree)
    with prof.phase(VERIFY):
        target, feats, load = verify(engine, tree, bits, prof.timer if prof.enabled else None)
    with prof.phase("accept/commit"):
        path, count, bonus, counts_host = accept(engine, tree, target, policy)
        commit(engine, path, count, bonus, feats, counts_host)
    prof.end_step(load)
    return path, count, bonus, tree.tokens, counts_host


def generate_speculative(engine: Engine, n_tokens: int, budget: int) -> list[list[int]]:
    """Greedy speculative decoding (lossless): at least n_tokens per sequence, first = the root."""
    out = [[t] for t in engine.root.tolist()]
    while min(len(o) for o in out) < n_tokens:
        path, count, bonus, tokens, _ = speculative_step(engine, budget)
        for o, new in zip(out, accepted_tokens(tokens, path, count, bonus), strict=True):
            o.extend(new)
    return [o[:n_tokens] for o in out]


@torch.no_grad()
def generate_plain(engine: Engine, n_tokens: int) -> list[list[int]]:
    """Plain greedy decoding, one token per target forward: the lossless reference."""
    B, dev = engine.root.shape[0], engine.root.device
    out = [[t] for t in engine.root.tolist()]
    bits = chain_bits(B, 1, dev)
    for _ in range(n_tokens - 1):
        reserve(engine, 1)
        greedy, _, _ = forward(engine, engine.root[:, None], engine.cache.lengths[:, None].long(), bits)
        engine.cache.lengths += 1
        advance(engine, [1] * B)
        engine.root = greedy[:, 0]
        for o, t in zip(out, engine.root.tolist(), strict=True):
            o.append(t)
    return out


# ---------------------------------------------------------------------------- the benchmark entry point


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

    def to_dict(self) -> dict:
        d = asdict(self)
        d["mean_step_ms"] = 1e3 * sum(self.step_times_s) / max(len(self.step_times_s), 1)
        return d


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


def check_settings(s: DecodeSettings) -> None:
    if s.acceptance not in ("replay", "greedy"):
        raise ValueError(f"acceptance: expected 'replay' or 'greedy', got {s.acceptance!r}")
    for name in ("context", "steps", "batch", "budget"):
        if getattr(s, name) < 1:
            raise ValueError(f"{name}: expected >= 1, got {getattr(s, name)}")
    if s.warmup_steps < 0:
        raise ValueError(f"warmup_steps: expected >= 0, got {s.warmup_steps}")


def build_engine(s: DecodeSettings):
    """Config, engine with a synthetic context, and the acceptance policy for run_decode."""
    from kdengine.engine.graphs import choose_expert_impl

    check_settings(s)
    overrides = {} if s.layers is None else {"n_layers": s.layers}
    cfg = ModelConfig.from_name(s.config, **overrides)
    device, group = resolve_device(s.device), None
    if s.tp > 1:
        from kdengine.engine.parallel import backend_for, init_tp, local_device, rank_config

        group = init_tp(backend_for(device))
        if torch.distributed.get_world_size(group) != s.tp:
            raise ValueError(f"tp: expected the process group size {torch.distributed.get_world_size(group)}, got {s.tp}")
        cfg = rank_config(cfg, group)
        device = local_device(group) if device.type == "cuda" else device
    T = s.budget + 1
    total_steps = s.warmup_steps + 2 * s.steps + 2
    max_tokens = s.context + total_steps * T + cfg.draft_block
    engine = setup_engine(cfg, device, s.batch, max_tokens, s.backend, s.seed, group)
    engine.model.set_expert_impl(choose_expert_impl(cfg, device))
    fill_synthetic_context(engine, s.context, s.seed)
    policy = ReplayPolicy(s.mean_accept, s.seed, cfg.draft_block + 1) if s.acceptance == "replay" else None
    return engine, policy


def timed_steps(engine: Engine, s: DecodeSettings, policy, prof: Profiler, n: int, progress=None, offset: int = 0):
    """n steps; per-step wall times (CUDA events or perf_counter) and tokens per step."""
    cuda = engine.cache.pool.device.type == "cuda"
    marks, tokens = [], []
    for i in range(n):
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
        tokens.extend(counts)
        if progress is not None:
            progress(offset + i + 1, s.warmup_steps + s.steps)
    if cuda:
        torch.cuda.synchronize()
    times = [(a.elapsed_time(b) / 1e3) if cuda else (b - a) for a, b in marks]
    return times, tokens


def run_decode(s: DecodeSettings, progress=None) -> DecodeResult:
    """Measure speculative decoding on a synthetic context (see the module docstring)."""
    from kdengine.engine.graphs import capture_engine

    engine, policy = build_engine(s)
    notes = [f"synthetic context: {s.context} tokens of random latent KV rows written directly (no prefill forward)"]
    graphs = capture_engine(engine, s, notes) if s.cuda_graphs else False
    warm = Profiler(engine.cache.pool.device, enabled=False)
    timed_steps(engine, s, policy, warm, s.warmup_steps, progress)
    prof = Profiler(engine.cache.pool.device)
    times, tokens = timed_steps(engine, s, policy, prof, s.steps, progress, s.warmup_steps)
    phases = prof.phase_ms()
    if graphs:
        phases = split_graph_phases(engine, s, policy, phases)
        notes.append("verify split (attention/moe/other) measured on eager steps after the timed graph steps")
    B = s.batch
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
        device=str(engine.cache.pool.device),
        cuda_graphs_used=bool(graphs),
        expert_impl=engine.model.layers[-1].mlp.impl if engine.cfg.n_layers > engine.cfg.first_dense else "",
        notes=notes,
    )
    if engine.group is not None:
        gather_ranks(result, engine, prof.comm_ms())
    return result


def gather_ranks(result: DecodeResult, engine: Engine, all_reduce_ms: float) -> None:
    """TP: check every rank committed the same tokens; every rank's phases, expert load and
    all-reduce time on every rank, and their imbalance across ranks (kdengine.engine.parallel)."""
    from kdengine.engine.parallel import check_replicated, gather_profiles, summarize_ranks

    check_replicated(engine.group, root=engine.root, lengths=engine.cache.lengths)
    step_ms = 1e3 * sum(result.step_times_s) / max(len(result.step_times_s), 1)
    result.all_reduce_ms = all_reduce_ms
    result.all_reduce_share = all_reduce_ms / step_ms if step_ms > 0 else 0.0
    if result.cuda_graphs_used:
        result.notes.append("all-reduce time is not measured inside CUDA graph replays")
    mine = {
        "rank": engine.cfg.tp_rank, "device": result.device, "tok_per_s": result.tok_per_s, "step_ms": step_ms,
        "phase_ms": result.phase_ms,
        "moe_load": result.moe_load, "moe_imbalance": result.moe_imbalance,
        "all_reduce_ms": all_reduce_ms, "all_reduce_share": result.all_reduce_share,
        "peak_mem_gib": torch.cuda.max_memory_allocated() / 2**30 if result.device.startswith("cuda") else 0.0,
    }
    result.per_rank = gather_profiles(mine, engine.group)
    result.rank_imbalance = summarize_ranks(result.per_rank)
    result.moe_rank_imbalance = result.rank_imbalance["moe_tokens"]


def split_graph_phases(engine: Engine, s: DecodeSettings, policy, graph_phases: dict[str, float]) -> dict[str, float]:
    """Graph steps time verify as one replay; run a few eager steps with the profiler to split it
    into attention / MoE / other, scaled to the graph replay's verify time."""
    from kdengine.engine.graphs import release_graphs

    release_graphs(engine)
    eager = Profiler(engine.cache.pool.device)
    timed_steps(engine, s, policy, eager, min(4, s.steps))
    parts = ("verify-attention", "verify-moe", "other")
    e = eager.phase_ms()
    graph_verify, eager_verify = sum(graph_phases[k] for k in parts), sum(e[k] for k in parts)
    out = dict(graph_phases)
    for k in parts:
        out[k] = e[k] * graph_verify / eager_verify if eager_verify > 0 else 0.0
    return out
