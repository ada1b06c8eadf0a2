"""DDTree build + ancestor mask in one Triton kernel: the best-first heap of kdengine.engine.tree.build_tree
run on the device, one program per sequence, no host sync (CUDA-graph capturable).

    top_log_probs [B, L, K] float (sorted descending along K), top_token_ids [B, L, K] int, root [B] int
    -> tokens, parents, depths [B, T] int64 (T = budget + 1, node 0 = root, parents[:, 0] = -1),
       bits [B, T, W] int32 (the packed ancestor mask of kdengine.ops.mask, W = ceil(T / 32)),
       and optionally the bool mask [B, T, T].

The kernel replays the host heap exactly: the frontier is an array of FR >= 2 * budget + 1 slots, one per
push, in push order, so the heap's key (-score, depth, push index) is "max score, then min depth, then min
slot". Each of the budget pops is two warp reductions; the popped prefix pushes its next sibling
(score (s - lp[k]) + lp[k+1]) and its first child (score s + lp[0]) with the host's float64 operations
in the host's order, so ties and roundings come out the same. The ancestor row of a node is its parent's
row plus its own bit, kept in registers [TP, WP]; the rows are stored as the packed mask at the end.
One warp: every reduction stays inside the warp.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdengine import env
from kdengine.ops.mask import WORD_BITS, mask_words

# Triton decides interpreter or compiler when @triton.jit runs, i.e. when this module is imported.
INTERPRETED = env.triton_interpret()
MAX_BUDGET = 255  # T = budget + 1 <= 256, the verify contract's limit


# ---------------------------------------------------------------------------------------------
# kernel


@triton.jit
def _tree_build(
    LP, IDS, ROOT, TOKENS, PARENTS, DEPTHS, BITS, MASK,
    BUDGET: tl.constexpr, L: tl.constexpr, K: tl.constexpr, FR: tl.constexpr, TP: tl.constexpr,
    W: tl.constexpr, WP: tl.constexpr, RB: tl.constexpr, HAS_ROOT: tl.constexpr, WRITE_MASK: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    T: tl.constexpr = BUDGET + 1
    lp = LP + b * (L * K)
    ids = IDS + b * (L * K)
    tokens, parents, depths = TOKENS + b * T, PARENTS + b * T, DEPTHS + b * T
    bits = BITS + b * (T * W)

    # frontier: one slot per push, in push order (slot = the host heap's tie counter)
    slot = tl.arange(0, FR)
    neg_inf = tl.full([FR], float("-inf"), tl.float64)
    score = tl.where(slot == 0, tl.load(lp).to(tl.float64), neg_inf)
    depth = tl.where(slot == 0, 1, tl.zeros([FR], tl.int32))  # prefix depth d >= 1 (position d - 1)
    choice = tl.zeros([FR], tl.int32)  # candidate index k at position d - 1
    parent = tl.zeros([FR], tl.int32)  # node id of the prefix's parent
    pushed = tl.sum(tl.where(slot == 0, 1, 0), 0)  # 1, as an int32 scalar the loop carries

    # ancestor rows, packed: row i has bit j set when node j is an ancestor of node i (or i itself)
    row = tl.arange(0, TP)
    word = tl.arange(0, WP)
    anc = tl.where((row[:, None] == 0) & (word[None, :] == 0), 1, tl.zeros([TP, WP], tl.int32))

    if HAS_ROOT:
        tl.store(tokens, tl.load(ROOT + b).to(tl.int64))
    else:
        tl.store(tokens, 0)
    tl.store(parents, -1)
    tl.store(depths, 0)
    for node in range(1, T):
        best = tl.max(score, 0)
        key = tl.where(score == best, depth * FR + slot, 2147483647)
        pick = tl.min(key, 0)
        s = pick % FR
        d = pick // FR
        here = slot == s
        k = tl.sum(tl.where(here, choice, 0), 0)
        p = tl.sum(tl.where(here, parent, 0), 0)
        score = tl.where(here, neg_inf, score)
        at = (d - 1) * K + k
        tl.store(tokens + node, tl.load(ids + at).to(tl.int64))
        tl.store(parents + node, p.to(tl.int64))
        tl.store(depths + node, d.to(tl.int64))
        # next sibling: same parent, candidate k + 1 at the same position
        has_sib = k + 1 < K
        s_sib = (best - tl.load(lp + at).to(tl.float64)) + tl.load(lp + at + 1, mask=has_sib, other=0.0).to(tl.float64)
        new = (slot == pushed) & has_sib
        score = tl.where(new, s_sib, score)
        depth = tl.where(new, d, depth)
        choice = tl.where(new, k + 1, choice)
        parent = tl.where(new, p, parent)
        pushed += has_sib.to(tl.int32)
        # first child: the best candidate one position deeper
        has_child = d < L
        s_child = best + tl.load(lp + d * K, mask=has_child, other=0.0).to(tl.float64)
        new = (slot == pushed) & has_child
        score = tl.where(new, s_child, score)
        depth = tl.where(new, d + 1, depth)
        choice = tl.where(new, 0, choice)
        parent = tl.where(new, node, parent)
        pushed += has_child.to(tl.int32)
        # ancestor row of the new node = its parent's row + its own bit
        up = tl.sum(tl.where(row[:, None] == p, anc, 0), 0)  # [WP]
        own = tl.where(word == node // 32, tl.full([WP], 1, tl.int32) << (node % 32), 0)
        anc = tl.where(row[:, None] == node, (up | own)[None, :], anc)

    tl.store(bits + row[:, None] * W + word[None, :], anc, mask=(row[:, None] < T) & (word[None, :] < W))
    if WRITE_MASK:
        tl.debug_barrier()  # the bit rows above are read back below by other lanes
        mask = MASK + b * (T * T)
        col = tl.arange(0, TP)
        for r0 in range(0, TP, RB):
            r = r0 + tl.arange(0, RB)
            inside = (r[:, None] < T) & (col[None, :] < T)
            w = tl.load(bits + r[:, None] * W + col[None, :] // 32, mask=inside, other=0)
            seen = (w >> (col[None, :] % 32)) & 1
            tl.store(mask + r[:, None] * T + col[None, :], (seen != 0).to(tl.int8), mask=inside)


# ---------------------------------------------------------------------------------------------
# launcher


def unavailable_reason(device: torch.device) -> str | None:
    """None when the kernel runs on `device` (a GPU, or the CPU under TRITON_INTERPRET=1 set before
    this module was imported), else why not."""
    device = torch.device(device)
    if device.type == "cuda":
        return None
    if device.type == "cpu":
        if INTERPRETED:
            return None
        return "triton runs on the CPU only in its interpreter (set TRITON_INTERPRET=1 before importing kdengine)"
    return f"no triton support for device type {device.type!r}"


def check_inputs(top_log_probs: torch.Tensor, top_token_ids: torch.Tensor, budget: int, root) -> None:
    if top_log_probs.dim() != 3 or top_token_ids.shape != top_log_probs.shape:
        raise ValueError(
            f"top_log_probs/top_token_ids: expected equal shapes [B, L, K], got "
            f"{list(top_log_probs.shape)} and {list(top_token_ids.shape)}"
        )
    if not top_log_probs.is_floating_point() or top_token_ids.is_floating_point():
        raise ValueError(f"top_log_probs/top_token_ids: expected float and int dtypes, got {top_log_probs.dtype} and {top_token_ids.dtype}")
    if top_token_ids.device != top_log_probs.device:
        raise ValueError(f"top_token_ids: expected device {top_log_probs.device}, got {top_token_ids.device}")
    if not isinstance(budget, int) or not 1 <= budget <= MAX_BUDGET:
        raise ValueError(f"budget: expected an int in [1, {MAX_BUDGET}] (T = budget + 1 <= 256), got {budget!r}")
    B, L, K = top_log_probs.shape
    prefixes = sum(K**d for d in range(1, L + 1))
    if prefixes < budget:
        raise ValueError(f"budget: expected <= the {prefixes} prefixes of L={L}, K={K}, got {budget}")
    if root is not None and (root.shape != (B,) or root.device != top_log_probs.device or root.is_floating_point()):
        raise ValueError(f"root: expected an int tensor [B={B}] on {top_log_probs.device}, got {root.dtype} {list(root.shape)} on {root.device}")


def build_tree_mask(top_log_probs: torch.Tensor, top_token_ids: torch.Tensor, budget: int, root=None, with_mask: bool = False):
    """(tokens, parents, depths [B, T] int64, bits [B, T, W] int32, mask [B, T, T] bool or None) of the
    DDTree of `budget` nodes (see the module docstring). One launch; shape checks only (no host sync)."""
    check_inputs(top_log_probs, top_token_ids, budget, root)
    reason = unavailable_reason(top_log_probs.device)
    if reason is not None:
        raise RuntimeError(f"tree_build: {reason}")
    B, L, K = top_log_probs.shape
    T, W, dev = budget + 1, mask_words(budget + 1), top_log_probs.device
    lp, ids = top_log_probs.contiguous(), top_token_ids.contiguous()
    tokens = torch.empty(B, T, dtype=torch.int64, device=dev)
    parents, depths = torch.empty_like(tokens), torch.empty_like(tokens)
    bits = torch.empty(B, T, W, dtype=torch.int32, device=dev)
    mask = torch.empty(B, T, T, dtype=torch.bool, device=dev) if with_mask else None
    TP = triton.next_power_of_2(T)
    _tree_build[(B,)](
        lp, ids, root if root is not None else tokens, tokens, parents, depths, bits,
        mask.view(torch.int8) if with_mask else bits,
        BUDGET=budget, L=L, K=K, FR=triton.next_power_of_2(2 * budget + 1), TP=TP, W=W,
        WP=triton.next_power_of_2(W), RB=max(1, min(TP, 2048 // TP)), HAS_ROOT=root is not None,
        WRITE_MASK=with_mask, num_warps=1,
    )
    return tokens, parents, depths, bits, mask


__all__ = ["MAX_BUDGET", "WORD_BITS", "build_tree_mask", "unavailable_reason"]
