"""CUDA graphs for the two fixed-shape forwards of a step: the target verify forward (per (T, B)) and
the drafter block forward (per B). Captured once, replayed at any context length: every length the
forwards read (cache lengths, page table) is a device buffer the engine updates in place, and the
verify kernel's host-side checks are skipped while capturing (kdengine.ops.validate).

Needs a graph-safe verify backend (not `reference`, which reads lengths on the host) and a graph-safe
MoE expert path (grouped_mm, or dense where torch._grouped_mm does not run).
"""

from __future__ import annotations

import torch

from kdengine.engine.config import ModelConfig
from kdengine.engine.model import EXPERT_IMPLS, MoE, torch_dtype

WARMUP_RUNS = 3


# ---------------------------------------------------------------------------- expert path


def grouped_mm_works(device: torch.device, dtype: torch.dtype) -> bool:
    """True when torch._grouped_mm runs here for this dtype and matches per-group matmuls."""
    if not hasattr(torch, "_grouped_mm"):
        return False
    try:
        gen = torch.Generator(device=device).manual_seed(0)
        a = torch.randn(40, 64, generator=gen, device=device).to(dtype)
        b = torch.randn(3, 48, 64, generator=gen, device=device).to(dtype)  # [E, N, K] like the weights
        offs = torch.tensor([8, 8, 40], dtype=torch.int32, device=device)
        out = torch._grouped_mm(a, b.transpose(1, 2), offs=offs)
        ref = torch.cat([a[:8] @ b[0].t(), a[8:40] @ b[2].t()])
        return bool(torch.allclose(out.float(), ref.float(), rtol=2e-2, atol=2e-2))
    except (RuntimeError, NotImplementedError, TypeError):
        return False


def choose_expert_impl(cfg: ModelConfig, device: torch.device) -> str:
    """loop on the CPU (exact groups, host counts); on CUDA grouped_mm if it runs, else dense."""
    device = torch.device(device)
    if device.type != "cuda":
        return "loop"
    return "grouped_mm" if grouped_mm_works(device, torch_dtype(cfg.dtype)) else "dense"


# ---------------------------------------------------------------------------- capture / replay


class CapturedFn:
    """fn(*static_inputs) captured in a CUDA graph; calling copies new inputs in and replays."""

    def __init__(self, fn, example_inputs: list[torch.Tensor]):
        self.static = [x.clone() for x in example_inputs]
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            for _ in range(WARMUP_RUNS):
                fn(*self.static)
        torch.cuda.current_stream().wait_stream(stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph), torch.no_grad():
            self.outputs = fn(*self.static)

    def __call__(self, *inputs: torch.Tensor):
        for s, x in zip(self.static, inputs, strict=True):
            s.copy_(x)
        self.graph.replay()
        return self.outputs


def graph_blocker(engine) -> str | None:
    """Why the engine's forwards cannot be captured, or None."""
    if engine.cache.pool.device.type != "cuda":
        return "not on a CUDA device"
    if engine.backend == "reference":
        return "the reference verify backend reads lengths on the host"
    impls = {m.impl for m in engine.model.modules() if isinstance(m, MoE)}
    if "loop" in impls:
        return "the loop expert path reads counts on the host"
    if engine.group is not None:
        return "tensor-parallel collectives are not captured yet"
    return None


def capture_engine(engine, settings, notes: list[str]) -> bool:
    """Capture verify (T = budget + 1, B) and the drafter forward; install them on the engine."""
    from kdengine.engine.drafter import draft_block
    from kdengine.engine.generate import chain_bits, forward, reserve

    reason = graph_blocker(engine)
    if reason is not None:
        notes.append(f"cuda graphs: off ({reason})")
        return False
    B, T = engine.root.shape[0], settings.budget + 1
    dev = engine.root.device
    reserve(engine, max(T, engine.cfg.draft_block))  # warm-up runs write tree rows past the lengths
    tokens = torch.zeros(B, T, dtype=torch.int64, device=dev)
    positions = engine.cache.lengths[:, None].long() + torch.arange(T, device=dev)
    try:
        verify = CapturedFn(lambda t, p, m: forward(engine, t, p, m), [tokens, positions, chain_bits(B, T, dev)])
        drafter = CapturedFn(lambda r: draft_block(engine.drafter, engine.dcache, r), [engine.root])
        tree_graph, mask_graph = capture_tree_builder(*drafter.outputs, engine.root, settings.budget)
    except RuntimeError as exc:  # a backend or op that cannot be captured: measure eagerly, say so
        notes.append(f"cuda graphs: capture failed, running eagerly ({str(exc).splitlines()[0][:200]})")
        torch.cuda.synchronize()
        return False
    engine.verify_fn = verify
    engine.draft_graph = lambda e: drafter(e.root)
    engine.tree_graph, engine.mask_graph = tree_graph, mask_graph
    notes.append(f"cuda graphs: drafter, tree, mask and verify (T={T}, B={B}) captured once, replayed at every context length")
    return True


def capture_tree_builder(log_probs, ids, root, budget: int):
    """Graphs of the DDTree build and of its mask for inputs shaped like these ([B, L, K], [B]):
    returns (tree_fn(log_probs, ids, root) -> (tokens, parents, depths), mask_fn(parents) -> (mask, bits)).
    What the benchmarks time as tree + mask at a budget."""
    from kdengine.engine.generate import tree_mask_bits
    from kdengine.engine.tree import build_tree_device

    def tree_fn(lp, i, r):
        t = build_tree_device(lp, i, budget, root_token=r, with_mask=False)
        return t.tokens, t.parents, t.depths

    tree = CapturedFn(tree_fn, [log_probs, ids, root])
    mask = CapturedFn(tree_mask_bits, [tree.outputs[1]])
    return tree, mask


def release_graphs(engine) -> None:
    engine.verify_fn = None
    engine.draft_graph = None
    engine.tree_graph = None
    engine.mask_graph = None


__all__ = ["EXPERT_IMPLS", "CapturedFn", "capture_engine", "capture_tree_builder", "choose_expert_impl", "grouped_mm_works", "release_graphs"]
