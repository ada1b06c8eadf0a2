"""The reference backend: plain torch with fp32 math on any device. The oracle every kernel is
tested against; it reads device lengths on the host, so it is not CUDA-graph safe (and need not be).
"""

from __future__ import annotations

import torch

from kdengine.ops.mask import unpack_tree_mask

DV = 512  # value dims: the first 512 of the 576-dim latent row


def gather_kv(kv_cache: torch.Tensor, page_table_row: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """The first n_tokens rows of one sequence's KV, in order: [N, 576]."""
    page_size = kv_cache.shape[1]
    pos = torch.arange(n_tokens, device=kv_cache.device)
    pages = page_table_row.long()[pos // page_size]
    return kv_cache[pages, pos % page_size]


def verify_attention_reference(
    q: torch.Tensor,  # [B, T, H, 576]
    kv_cache: torch.Tensor,  # [num_pages, page_size, 576]
    page_table: torch.Tensor,  # [B, max_pages]
    prefix_len: torch.Tensor,  # [B]
    mask_bits: torch.Tensor,  # [B, T, W] packed
    *,
    sm_scale: float,
    nsplit: int | None = None,
    return_lse: bool = False,
):
    B, T, H, _ = q.shape
    tree = unpack_tree_mask(mask_bits, T)  # [B, T, T]
    out = torch.empty(B, T, H, DV, dtype=q.dtype, device=q.device)
    lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    for b, prefix in enumerate(prefix_len.tolist()):
        kv = gather_kv(kv_cache, page_table[b], prefix + T).float()  # [N, 576]
        scores = torch.einsum("thd,nd->thn", q[b].float(), kv) * sm_scale  # [T, H, N]
        visible = torch.ones(T, prefix + T, dtype=torch.bool, device=q.device)
        visible[:, prefix:] = tree[b]
        scores = scores.masked_fill(~visible[:, None, :], float("-inf"))
        lse[b] = torch.logsumexp(scores, dim=-1)
        probs = torch.softmax(scores, dim=-1)
        out[b] = torch.einsum("thn,nd->thd", probs, kv[:, :DV]).to(q.dtype)
    return out, (lse if return_lse else None)
