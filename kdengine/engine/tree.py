"""DDTree draft trees: the `budget` most probable prefixes under per-position top-k log-probs.

A prefix of depth d picks one candidate at each of positions 0..d-1; its score is the sum of the
picked log-probs. The tree is the root (node 0: the last accepted token, not counted in the budget)
plus the `budget` best prefixes, which form a prefix-closed set (a prefix scores no higher than its
parent). Nodes come in best-first order, so every parent precedes its children.

    top_log_probs [L, K] (or [B, L, K]) float, sorted descending along K, all <= 0
    top_token_ids [L, K] (or [B, L, K]) int
    -> DraftTree(tokens [1+n], parents [1+n] (parents[0] = -1), depths [1+n], mask [1+n, 1+n] bool)

build_tree is the best-first heap on the host (the definition); build_tree_device gives the same tree
with fixed shapes and no host sync (a per-depth beam of width `budget`: the global best prefixes at
depth d only extend the best `budget` prefixes at depth d-1), batched, in torch ops. tree_and_mask is
what the engine's step runs: the tree and its packed ancestor mask from one Triton kernel
(kdengine.ops.tree_build: the host heap replayed on the device) where Triton runs, else the torch path.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from kdengine.ops import tree_build
from kdengine.ops.mask import mask_from_parents, pack_tree_mask


@dataclass
class DraftTree:
    tokens: torch.Tensor  # [(B,) 1+n] int64, tokens[..., 0] = root token
    parents: torch.Tensor  # [(B,) 1+n] int64, parents[..., 0] = -1
    depths: torch.Tensor  # [(B,) 1+n] int64, depths[..., 0] = 0
    mask: torch.Tensor | None  # [(B,) 1+n, 1+n] bool, ancestor-only (diagonal included)

    @property
    def size(self) -> int:
        return self.tokens.shape[-1]


def check_draft(top_log_probs: torch.Tensor, top_token_ids: torch.Tensor, budget: int) -> None:
    if top_log_probs.shape != top_token_ids.shape or top_log_probs.dim() not in (2, 3):
        raise ValueError(
            f"top_log_probs/top_token_ids: expected equal shapes [(B,) L, K], got "
            f"{list(top_log_probs.shape)} and {list(top_token_ids.shape)}"
        )
    if not isinstance(budget, int) or not 1 <= budget <= 255:
        raise ValueError(f"budget: expected an int in [1, 255] (T = budget + 1 <= 256), got {budget!r}")


# ---------------------------------------------------------------------------- host (the definition)


def build_tree(top_log_probs: torch.Tensor, top_token_ids: torch.Tensor, budget: int, root_token: int = 0) -> DraftTree:
    """Best-first heap over prefixes; each popped prefix pushes its next sibling and its first child."""
    check_draft(top_log_probs, top_token_ids, budget)
    lp = top_log_probs.detach().double().cpu().tolist()
    ids = top_token_ids.detach().cpu().tolist()
    L, K = len(lp), len(lp[0])
    tokens, parents, depths = [root_token], [-1], [0]
    # heap entries: (-score, depth, tie, choice index at this depth, parent node)
    heap = [(-lp[0][0], 1, 0, 0, 0)]
    tie = 1
    while heap and len(tokens) <= budget:
        neg, d, _, k, parent = heapq.heappop(heap)
        node = len(tokens)
        tokens.append(ids[d - 1][k])
        parents.append(parent)
        depths.append(d)
        if k + 1 < K:  # next sibling: same parent, next candidate
            heapq.heappush(heap, (neg + lp[d - 1][k] - lp[d - 1][k + 1], d, tie, k + 1, parent))
            tie += 1
        if d < L:  # first child: best candidate one position deeper
            heapq.heappush(heap, (neg - lp[d][0], d + 1, tie, 0, node))
            tie += 1
    parents_t = torch.tensor(parents, dtype=torch.int64)
    return DraftTree(
        tokens=torch.tensor(tokens, dtype=torch.int64),
        parents=parents_t,
        depths=torch.tensor(depths, dtype=torch.int64),
        mask=mask_from_parents(parents_t),
    )


# ---------------------------------------------------------------------------- device (no host sync)


def beam_prefixes(lp: torch.Tensor, n: int):
    """Per depth, the best n prefixes. lp [B, L, K] -> scores [B, L, n], choice [B, L, n] (index in K),
    parent beam slot [B, L, n] (slot at depth-1); empty slots score -inf."""
    B, L, K = lp.shape
    neg = torch.full((B, n), float("-inf"), dtype=lp.dtype, device=lp.device)
    width = min(n, K)
    score = torch.cat([lp[:, 0, :width], neg[:, width:]], 1)  # [B, n]
    choice = torch.cat([torch.arange(width, device=lp.device).expand(B, width), torch.zeros_like(neg[:, width:], dtype=torch.int64)], 1)
    parent = torch.zeros(B, n, dtype=torch.int64, device=lp.device)
    scores, choices, parents = [score], [choice], [parent]
    for d in range(1, L):
        ext = (score[:, :, None] + lp[:, d, None, :]).reshape(B, n * K)  # [B, n*K]
        score, flat = torch.topk(ext, n, dim=-1)  # sorted descending
        choice, parent = flat % K, flat // K
        scores.append(score)
        choices.append(choice)
        parents.append(parent)
    return torch.stack(scores, 1), torch.stack(choices, 1), torch.stack(parents, 1)


def build_tree_device(
    top_log_probs: torch.Tensor, top_token_ids: torch.Tensor, budget: int, root_token=None, with_mask: bool = True
) -> DraftTree:
    """Batched DDTree with fixed shapes on the inputs' device. top_* [B, L, K] (or [L, K]); root_token
    [B] tensor or None (0). Needs at least `budget` prefixes (K + K^2 + ... + K^L >= budget).
    with_mask=False leaves mask None (the engine builds it as its own timed phase: build_masks)."""
    check_draft(top_log_probs, top_token_ids, budget)
    squeeze = top_log_probs.dim() == 2
    lp = (top_log_probs[None] if squeeze else top_log_probs).double()  # sums as exact as the host heap
    ids = top_token_ids[None] if squeeze else top_token_ids
    B, L, K = lp.shape
    if sum(K**d for d in range(1, L + 1)) < budget:
        raise ValueError(f"budget: expected <= the {sum(K**d for d in range(1, L + 1))} prefixes of L={L}, K={K}, got {budget}")
    n, dev = budget, lp.device
    scores, choices, beam_parent = beam_prefixes(lp, n)  # [B, L, n]
    # Global best n over all depths; a stable sort keeps shallower prefixes first on ties.
    order = torch.sort(scores.reshape(B, L * n), dim=-1, descending=True, stable=True).indices[:, :n]  # [B, n]
    depth0 = order // n  # draft position = depth - 1
    node_of = torch.full((B, L * n), -1, dtype=torch.int64, device=dev)
    node_of.scatter_(1, order, torch.arange(1, n + 1, device=dev).expand(B, n))  # beam cell -> node id
    par_cell = (depth0 - 1).clamp(min=0) * n + beam_parent.reshape(B, L * n).gather(1, order)
    parents = torch.where(depth0 == 0, torch.zeros_like(order), node_of.gather(1, par_cell))
    choice = choices.reshape(B, L * n).gather(1, order)
    tokens = ids.gather(1, depth0.clamp(max=L - 1)[:, :, None].expand(B, n, K)).gather(2, choice[:, :, None])[..., 0]
    root = torch.zeros(B, 1, dtype=torch.int64, device=dev) if root_token is None else root_token.reshape(B, 1).long()
    parents = torch.cat([torch.full((B, 1), -1, dtype=torch.int64, device=dev), parents], 1)
    tree = DraftTree(
        tokens=torch.cat([root, tokens.long()], 1),
        parents=parents,
        depths=torch.cat([torch.zeros(B, 1, dtype=torch.int64, device=dev), depth0 + 1], 1),
        mask=build_masks(parents) if with_mask else None,
    )
    if squeeze:
        return DraftTree(tree.tokens[0], tree.parents[0], tree.depths[0], None if tree.mask is None else tree.mask[0])
    return tree


def build_masks(parents: torch.Tensor) -> torch.Tensor:
    """[B, T] parents -> [B, T, T] ancestor masks (kdengine.ops.mask.mask_from_parents per row)."""
    return torch.stack([mask_from_parents(p) for p in parents])


# ---------------------------------------------------------------------------- the engine's tree + mask


def tree_and_mask(top_log_probs: torch.Tensor, top_token_ids: torch.Tensor, budget: int, root_token: torch.Tensor):
    """(DraftTree with mask None, packed ancestor mask bits [B, T, W] int32) for top_* [B, L, K] and
    root_token [B]: one Triton launch where the kernel runs on the inputs' device, else the torch path
    (build_tree_device + build_masks + pack_tree_mask). Same tree either way; no host sync."""
    if tree_build.unavailable_reason(top_log_probs.device) is None:
        tokens, parents, depths, bits, _ = tree_build.build_tree_mask(top_log_probs, top_token_ids, budget, root_token)
        return DraftTree(tokens, parents, depths, mask=None), bits
    tree = build_tree_device(top_log_probs, top_token_ids, budget, root_token=root_token, with_mask=False)
    return tree, pack_tree_mask(build_masks(tree.parents))
