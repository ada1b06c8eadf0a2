"""Tree masks: the bool [B, T, T] form users pass and the packed bit form the kernels read.

Packed form: int32 [B, T, W] with W = ceil(T / 32); bit (j % 32) of word (j // 32) in row i is set
when tree token i may attend to tree token j. Every tree token sees the whole prefix, so the mask only
covers the tree tail.
"""

from __future__ import annotations

import torch

WORD_BITS = 32


def mask_words(T: int) -> int:
    """Number of int32 words per packed mask row."""
    return (T + WORD_BITS - 1) // WORD_BITS


def pack_tree_mask(mask: torch.Tensor) -> torch.Tensor:
    """Pack a bool mask [B, T, T] (or [T, T]) into int32 words [B, T, W]. Runs on the mask's device."""
    if mask.dtype != torch.bool:
        raise ValueError(f"mask: expected dtype torch.bool, got {mask.dtype}")
    if mask.dim() == 2:
        mask = mask.unsqueeze(0)
    if mask.dim() != 3 or mask.shape[1] != mask.shape[2]:
        raise ValueError(f"mask: expected shape [B, T, T], got {list(mask.shape)}")
    B, T, _ = mask.shape
    W = mask_words(T)
    padded = torch.zeros(B, T, W * WORD_BITS, dtype=torch.int64, device=mask.device)
    padded[:, :, :T] = mask.to(torch.int64)
    weights = torch.bitwise_left_shift(
        torch.ones(WORD_BITS, dtype=torch.int64, device=mask.device),
        torch.arange(WORD_BITS, dtype=torch.int64, device=mask.device),
    )
    words = (padded.view(B, T, W, WORD_BITS) * weights).sum(-1)  # [B, T, W] in [0, 2^32)
    words = torch.where(words >= 2**31, words - 2**32, words)
    return words.to(torch.int32).contiguous()


def unpack_tree_mask(bits: torch.Tensor, T: int) -> torch.Tensor:
    """Inverse of :func:`pack_tree_mask`: int32 [B, T, W] -> bool [B, T, T]."""
    B = bits.shape[0]
    shifts = torch.arange(WORD_BITS, dtype=torch.int64, device=bits.device)
    words = bits.to(torch.int64) & 0xFFFFFFFF
    expanded = (torch.bitwise_right_shift(words.unsqueeze(-1), shifts) & 1).bool()  # [B, T, W, 32]
    return expanded.reshape(B, T, -1)[:, :, :T].contiguous()


def mask_from_parents(parents: torch.Tensor) -> torch.Tensor:
    """Ancestor-only mask [T, T] (diagonal included) from a parent vector (parents[0] = -1).

    Transitive closure of (I + parent edges) by ceil(log2 T) boolean squarings, on the parents'
    device with no host sync.
    """
    T = parents.shape[0]
    # Scalar fills only (no host tensors), so this also runs inside CUDA graph capture.
    step = torch.eye(T, dtype=torch.float32, device=parents.device)
    step.scatter_(1, parents.clamp(min=0).long().view(T, 1), 1.0)  # the root's -1 maps onto its diagonal
    for _ in range(max(1, (T - 1).bit_length())):
        step = (step @ step).clamp_(max=1.0)
    return step > 0


def chain_mask(T: int, device=None) -> torch.Tensor:
    """Causal (chain) mask [T, T]: token i sees tokens 0..i."""
    return torch.ones(T, T, dtype=torch.bool, device=device).tril()


def is_ancestor_closed(mask: torch.Tensor) -> torch.Tensor:
    """Per batch element, True when the bool mask [B, T, T] is a valid ancestor mask of a tree:
    it has its diagonal, is transitive (i sees j and j sees k => i sees k), and every row's visible
    set is a chain (any two tokens i sees are ancestor-related)."""
    m = mask.to(torch.float32)
    diag = mask.diagonal(dim1=1, dim2=2).all(-1)
    reach = torch.bmm(m, m) > 0
    transitive = ~(reach & ~mask).flatten(1).any(-1)
    # chain: for each row i and pair (j, k) both visible from i, mask[j, k] or mask[k, j].
    related = mask | mask.transpose(1, 2)  # [B, T, T]
    pairs = mask.unsqueeze(-1) & mask.unsqueeze(-2)  # [B, i, j, k]
    chain = ~(pairs & ~related.unsqueeze(1)).flatten(1).any(-1)
    return diag & transitive & chain
