"""One speculative step over an Engine: draft -> tree (+ mask) -> verify -> accept -> commit, as small
functions; prefill, plain greedy decoding (the lossless oracle) and greedy speculative generation.
The engine knows nothing about tokenization, timing harnesses or process groups (kdengine.engine.run,
kdengine.engine.parallel).

Graph or eager is decided in one place, replay_or_run(): a phase replays its captured CUDA graph when
capture_graphs() captured one for this engine, else it runs the same eager function. graphs.py holds
only the capture mechanics and imports nothing from here.

Letters: B batch, T = budget + 1 tree tokens, L drafter block, K top-k per position, W mask words.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from kdengine.engine import graphs
from kdengine.engine.accept import accept_greedy, accept_replay, accepted_tokens
from kdengine.engine.config import ModelConfig
from kdengine.engine.drafter import DraftCache, Drafter, append_context, draft_block
from kdengine.engine.kv_cache import PagedKVCache
from kdengine.engine.model import Step, Transformer, torch_dtype
from kdengine.engine.profiler import VERIFY, GraphOpTimer, Profiler
from kdengine.engine.tree import DraftTree, tree_and_mask
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
    draft_fn: Callable | None = None  # a caller's own drafter (tests): engine -> (log_probs, ids) [B, L, K]
    graphs: dict[str, graphs.CapturedFn] = field(default_factory=dict)  # phase -> graph (capture_graphs)
    budget: int | None = None  # the budget the graphs were captured at


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


# ---------------------------------------------------------------------------- graph or eager


def replay_or_run(engine: Engine, phase: str, eager: Callable, *inputs: torch.Tensor):
    """The one graph-or-eager choice: replay `phase`'s captured graph on `inputs` when the engine has
    one, else eager(*inputs) (the function the graph was captured from)."""
    graph = engine.graphs.get(phase)
    return graph(*inputs) if graph is not None else eager(*inputs)


def capture_graphs(engine: Engine, budget: int, notes: list[str]) -> bool:
    """Capture the drafter forward, the tree + mask build, the verify forward (T = budget + 1) and the
    commit's device part of this engine's batch; True when the first three were captured (else the
    engine stays eager; the commit graph is optional)."""
    impls = {m.impl for m in engine.model.modules() if hasattr(m, "impl")}
    reason = graphs.graph_blocker(engine.cache.pool.device, engine.backend, impls, engine.group)
    if reason is not None:
        notes.append(f"cuda graphs: off ({reason})")
        return False
    B, T, dev = engine.root.shape[0], budget + 1, engine.root.device
    reserve(engine, max(T, engine.cfg.draft_block))  # warm-up runs write tree rows past the lengths
    captured = {"draft": graphs.capture(draft_eager(engine), [engine.root], notes, "drafter")}
    if captured["draft"] is not None:
        lp, ids = captured["draft"].outputs
        captured["tree"] = graphs.capture(tree_eager(budget), [lp, ids, engine.root], notes, "tree")
    captured["verify"] = capture_verify(engine, budget, notes)
    if captured["verify"] is not None:  # count 0 in the example: the warm-up runs commit nothing
        feats = captured["verify"].outputs[1]
        path = torch.arange(T, device=dev).repeat(B, 1)
        count = torch.zeros(B, dtype=torch.int64, device=dev)
        commit_graph = graphs.capture(commit_eager(engine), [path, count, torch.zeros_like(feats)], notes, "commit")
        if commit_graph is not None:  # optional: the commit runs eagerly where it cannot be captured
            captured["commit"] = commit_graph
    if any(g is None for g in captured.values()) or len(captured) < 3:
        return False
    engine.graphs, engine.budget = captured, budget
    notes.append(f"cuda graphs: {', '.join(captured)} (T={T}, B={B}) captured once, replayed at every context length")
    return True


def capture_verify(engine: Engine, budget: int, notes: list[str], timer: GraphOpTimer | None = None):
    """The verify forward (T = budget + 1) captured; with `timer`, its op events are captured into
    the graph too (the profiling pass: replay, then timer.read()). None when capture fails."""
    B, T, dev = engine.root.shape[0], budget + 1, engine.root.device
    tokens = torch.zeros(B, T, dtype=torch.int64, device=dev)
    positions = engine.cache.lengths[:, None].long() + torch.arange(T, device=dev)

    def fn(tokens, positions, mask_bits):
        if timer is not None:
            timer.start()  # keep only the captured forward's marks, not the warm-up runs'
        return forward(engine, tokens, positions, mask_bits, timer)

    captured = graphs.capture(fn, [tokens, positions, chain_bits(B, T, dev)], notes, "profiled verify" if timer else "verify")
    if captured is not None:
        captured.timer = timer
    return captured


def profile_verify_in_graph(engine: Engine, notes: list[str]) -> bool:
    """Swap the captured verify graph for one with its op events inside (GraphOpTimer): steps after
    this report each op's time under replay. False (graphs unchanged) when that capture fails."""
    if "verify" not in engine.graphs:
        return False
    old = engine.graphs.pop("verify")
    del old
    torch.cuda.empty_cache()
    reserve(engine, engine.budget + 1)  # warm-up runs write tree rows past the lengths
    profiled = capture_verify(engine, engine.budget, notes, GraphOpTimer())
    if profiled is None:
        engine.graphs["verify"] = capture_verify(engine, engine.budget, notes)
        return False
    engine.graphs["verify"] = profiled
    return True


def release_graphs(engine: Engine) -> None:
    """Back to eager phases (the graphs' memory goes with them)."""
    engine.graphs, engine.budget = {}, None


# ---------------------------------------------------------------------------- eager phase functions


def draft_eager(engine: Engine):
    return lambda root: draft_block(engine.drafter, engine.dcache, root)


def tree_eager(budget: int):
    def build(log_probs, ids, root):
        tree, bits = tree_and_mask(log_probs, ids, budget, root)
        return tree.tokens, tree.parents, tree.depths, bits

    return build


def commit_eager(engine: Engine):
    return lambda path, count, features: commit_rows(engine, path, count, features)


def verify_eager(engine: Engine, timer=None):
    return lambda tokens, positions, mask_bits: forward(engine, tokens, positions, mask_bits, timer)


def forward(engine: Engine, tokens, positions, mask_bits, timer=None):
    """Target forward of tokens [B, T] at the cache's current lengths -> (greedy [B, T], features, load)."""
    step = Step(engine.cfg, engine.cache, mask_bits, engine.backend, engine.group)
    greedy, feats = engine.model(tokens, positions, step, timer)
    return greedy, feats, step.expert_load


# ---------------------------------------------------------------------------- context


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
    return replay_or_run(engine, "draft", draft_eager(engine), engine.root)


def make_tree(engine: Engine, log_probs, ids, budget: int) -> tuple[DraftTree, torch.Tensor]:
    """The DDTree (mask None) and its packed ancestor mask [B, T, W], built together."""
    tokens, parents, depths, bits = replay_or_run(engine, "tree", tree_eager(budget), log_probs, ids, engine.root)
    return DraftTree(tokens, parents, depths, mask=None), bits


def verify(engine: Engine, tree: DraftTree, mask_bits, timer=None):
    """Write tree KV into the pages and run the target over the T tree tokens."""
    positions = engine.cache.lengths[:, None].long() + tree.depths
    return replay_or_run(engine, "verify", verify_eager(engine, timer), tree.tokens, positions, mask_bits)


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
    replay_or_run(engine, "commit", commit_eager(engine), path, count, features)
    engine.root = bonus
    advance(engine, counts_host)


def commit_rows(engine: Engine, path, count, features) -> None:
    """The device part of commit (fixed shapes, no host sync: captured as the `commit` graph)."""
    engine.cache.compact(path, count)
    feats = features.gather(1, path[:, :, None].expand(-1, -1, features.shape[-1]))
    append_context(engine.drafter, engine.dcache, feats, count)


@torch.no_grad()
def speculative_step(engine: Engine, budget: int, policy=None, prof: Profiler | None = None):
    """One step; returns (path, count, bonus, tree tokens, tokens per sequence on the host). The tree
    and its mask come from one build (timed as `tree`; the `mask` phase stays 0)."""
    if engine.graphs and budget != engine.budget:
        raise ValueError(f"budget: expected {engine.budget} (the captured verify graph's), got {budget}")
    prof = prof or Profiler(engine.cache.pool.device, enabled=False)
    reserve(engine, budget + 1)
    with prof.phase("draft"):
        log_probs, ids = draft(engine)
    with prof.phase("tree"):
        tree, bits = make_tree(engine, log_probs, ids, budget)
    with prof.phase(VERIFY):
        target, feats, load = verify(engine, tree, bits, prof.timer if prof.enabled else None)
    replayed = engine.graphs.get("verify")
    if prof.enabled and getattr(replayed, "timer", None) is not None:
        prof.add_replayed(replayed.timer.read())  # the ops of this replay (one host sync: profiling pass)
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
    """Plain greedy decoding, one token per target forward: the lossless reference (always eager)."""
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
