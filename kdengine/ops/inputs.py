"""Random verify-attention problems: shared by tests, benchmarks and the self-check.

Random (never zero) bf16 q and KV, shuffled page tables, per-sequence prefix lengths, and a random
tree (parents drawn at random) or a chain.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kdengine.ops.mask import chain_mask, mask_from_parents
from kdengine.ops.shapes import D_QK, PAGE_SIZE


@dataclass
class VerifyInputs:
    q: torch.Tensor  # [B, T, H, 576] bf16
    kv_cache: torch.Tensor  # [P, page_size, 576] bf16
    page_table: torch.Tensor  # [B, max_pages] int32
    prefix_len: torch.Tensor  # [B] int32
    tree_mask: torch.Tensor  # [B, T, T] bool
    parents: torch.Tensor  # [B, T] int64, parents[:, 0] = -1
    sm_scale: float

    def args(self):
        return (self.q, self.kv_cache, self.page_table, self.prefix_len, self.tree_mask)


def random_parents(T: int, gen: torch.Generator, chain: bool = False) -> torch.Tensor:
    """Parent vector of a random tree in topological order: parents[i] drawn from 0..i-1."""
    if chain:
        return torch.arange(-1, T - 1)
    parents = torch.empty(T, dtype=torch.int64)
    parents[0] = -1
    for i in range(1, T):
        parents[i] = int(torch.randint(0, i, (1,), generator=gen))
    return parents


def make_verify_inputs(
    *,
    B: int = 1,
    T: int = 16,
    H: int = 8,
    prefix: int | list[int] = 1000,
    page_size: int = PAGE_SIZE,
    shuffle_pages: bool = True,
    chain: bool = False,
    extra_pages: int = 0,
    sm_scale: float = 192**-0.5,
    seed: int = 0,
    device: str | torch.device = "cpu",
) -> VerifyInputs:
    """A random problem. `prefix` is one length for every sequence or one per sequence."""
    gen = torch.Generator().manual_seed(seed)
    prefixes = [prefix] * B if isinstance(prefix, int) else list(prefix)
    if len(prefixes) != B:
        raise ValueError(f"prefix: expected {B} lengths, got {len(prefixes)}")
    pages_per_seq = [(p + T + page_size - 1) // page_size for p in prefixes]
    max_pages = max(pages_per_seq) + extra_pages
    total_pages = sum(pages_per_seq) + 1  # one spare page that no sequence uses
    order = torch.randperm(total_pages, generator=gen) if shuffle_pages else torch.arange(total_pages)
    page_table = torch.zeros(B, max_pages, dtype=torch.int32)
    start = 0
    for b, n in enumerate(pages_per_seq):
        page_table[b, :n] = order[start : start + n].to(torch.int32)
        start += n
    dev = torch.device(device)
    if dev.type == "cpu":
        q = torch.randn(B, T, H, D_QK, generator=gen).to(torch.bfloat16)
        kv = torch.randn(total_pages, page_size, D_QK, generator=gen).to(torch.bfloat16)
    else:  # fast path: draw q and the (large) KV pool on the device itself (other values than on the CPU)
        dgen = torch.Generator(device=dev).manual_seed(seed)
        q = torch.randn(B, T, H, D_QK, generator=dgen, device=dev).to(torch.bfloat16)
        kv = torch.randn(total_pages, page_size, D_QK, generator=dgen, device=dev).to(torch.bfloat16)
    parents = torch.stack([random_parents(T, gen, chain) for _ in range(B)])
    tree = torch.stack([chain_mask(T) if chain else mask_from_parents(p) for p in parents])
    return VerifyInputs(
        q=q.to(dev),
        kv_cache=kv.to(dev),
        page_table=page_table.to(dev),
        prefix_len=torch.tensor(prefixes, dtype=torch.int32, device=dev),
        tree_mask=tree.to(dev),
        parents=parents.to(dev),
        sm_scale=sm_scale,
    )


def rel_l2(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref|| / ||ref|| in float64; NaN anywhere gives inf."""
    out64, ref64 = out.double(), ref.double()
    if not torch.isfinite(out64).all():
        return float("inf")
    return float((out64 - ref64).norm() / ref64.norm().clamp_min(1e-30))
