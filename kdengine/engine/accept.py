"""Acceptance: which tree nodes a step keeps, and the bonus token.

Policy `greedy` (lossless): walk the tree from the root along the target's greedy tokens; a child
whose token equals the target's choice is accepted; the first node with no matching child yields
the bonus token (the target's choice there). Fixed shapes, no host sync.

Policy `replay` (synthetic weights): the whole tree is verified (full cost) but the number of tokens
a step yields is replayed from a seeded sequence with a stated mean; the kept KV rows are tree slots
0..n-1 and the emitted tokens are not meaningful text. Reports always name the policy.

    tree_tokens, parents [B, T]; target [B, T] (the target's greedy token after each node)
    -> path [B, T] (accepted node ids in order, root first; identity past count), count [B]
       (accepted nodes incl. the root = tokens this step yields), bonus [B]
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


def accept_greedy(tree_tokens: torch.Tensor, parents: torch.Tensor, target: torch.Tensor, max_depth: int):
    """Tree walk along the target's greedy tokens (see module docstring)."""
    B, T = tree_tokens.shape
    dev = tree_tokens.device
    path = torch.arange(T, device=dev).repeat(B, 1)
    cur = torch.zeros(B, dtype=torch.int64, device=dev)
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    count = torch.ones(B, dtype=torch.int64, device=dev)
    for depth in range(1, min(max_depth, T - 1) + 1):
        want = target.gather(1, cur[:, None])  # [B, 1]
        match = (parents == cur[:, None]) & (tree_tokens == want) & alive[:, None]
        found = match.any(-1)
        nxt = match.int().argmax(-1)
        cur = torch.where(found, nxt, cur)
        alive &= found
        path[:, depth] = torch.where(found, nxt, path[:, depth])
        count += found.long()
    bonus = target.gather(1, cur[:, None])[:, 0]
    return path, count, bonus


def accepted_tokens(tree_tokens: torch.Tensor, path: torch.Tensor, count: torch.Tensor, bonus: torch.Tensor) -> list[list[int]]:
    """Tokens each sequence emits this step: the accepted nodes below the root, then the bonus."""
    toks = tree_tokens.gather(1, path).tolist()
    return [toks[b][1 : int(n)] + [int(x)] for b, (n, x) in enumerate(zip(count.tolist(), bonus.tolist(), strict=True))]


# ---------------------------------------------------------------------------- replay


@dataclass
class ReplayPolicy:
    """Seeded tokens-per-step sequence: 1 + Binomial(max_len - 1, (mean - 1) / (max_len - 1)),
    so every step yields between 1 and max_len tokens and the expected value is `mean`."""

    mean: float = 5.0
    seed: int = 0
    max_len: int = 17  # block L + 1: at most L accepted draft tokens plus the bonus

    def __post_init__(self):
        if not 1.0 <= self.mean <= self.max_len:
            raise ValueError(f"mean_accept: expected a value in [1, {self.max_len}], got {self.mean}")
        self.rng = np.random.default_rng(self.seed)

    @property
    def name(self) -> str:
        return f"replay(mean={self.mean:g}, seed={self.seed})"

    def draw(self, batch: int) -> list[int]:
        n = self.max_len - 1
        return (1 + self.rng.binomial(n, (self.mean - 1) / n, size=batch)).tolist() if n else [1] * batch


def to_device(values: list[int], device) -> torch.Tensor:
    """int64 tensor on `device` without a host sync (pinned, non-blocking copy on CUDA)."""
    t = torch.tensor(values, dtype=torch.int64)
    if torch.device(device).type == "cuda":
        return t.pin_memory().to(device, non_blocking=True)
    return t.to(device)


def accept_replay(target: torch.Tensor, counts: list[int], T: int):
    """Keep tree slots 0..count-1 of each sequence; bonus = the target's token after slot count-1."""
    B = target.shape[0]
    dev = target.device
    count = to_device([min(c, T) for c in counts], dev)
    path = torch.arange(T, device=dev).repeat(B, 1)
    bonus = target.gather(1, (count - 1)[:, None])[:, 0]
    return path, count, bonus
