"""The drafter's context attention as split-KV flash decoding (Triton): the L block queries of each
(sequence, head) against the keys 0 .. lengths[b] + L - 1 of the drafter's context cache, cut into NSPLIT
pieces that run as separate programs and are merged by log-sum-exp (the verify kernels' recipe: with
16 heads a per-head kernel leaves the GPU idle at long context).

    q    [B, Hd, L, dh] bf16/fp16      k, v  [B, Hd, S, dh] (the cache of one drafter layer)
    lengths [B] int32 (device; read only on the device: graph-safe)    -> out [B, Hd, L, dh] q.dtype

Every query sees every visible key (the drafter block attends bidirectionally to itself and to the whole
context), as torch's scaled_dot_product_attention with the drafter's boolean mask does. NSPLIT depends on
the capacity S only (host), the split bounds on the device lengths, so one graph replays at any length.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kdengine import env

INTERPRETED = env.triton_interpret()  # Triton picks interpreter or compiler when @triton.jit runs
BLOCK_N = 64  # keys per tile
KEYS_PER_SPLIT = 1024  # target keys per split at full capacity
MAX_SPLITS = 64
LOG2E = 1.4426950408889634


# ---------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _split(
    Q, K, V, LENS, OUT_P, LSE_P, scale_log2, S,
    HD: tl.constexpr, L: tl.constexpr, LP: tl.constexpr, DH: tl.constexpr, EXTRA: tl.constexpr,
    NSPLIT: tl.constexpr, BLOCK: tl.constexpr, UPCAST: tl.constexpr,
):
    bh = tl.program_id(0).to(tl.int64)
    split = tl.program_id(1)
    b = bh // HD
    n = tl.minimum(tl.load(LENS + b) + EXTRA, S)  # visible keys
    chunk = tl.cdiv(tl.cdiv(n, NSPLIT), BLOCK) * BLOCK
    lo = split * chunk
    hi = tl.minimum(lo + chunk, n)
    rows = tl.arange(0, LP)
    d = tl.arange(0, DH)
    q = tl.load(Q + bh * (L * DH) + rows[:, None] * DH + d[None, :], mask=rows[:, None] < L, other=0.0)
    if UPCAST:  # the interpreter multiplies bf16 operands as raw bits: give it fp32 copies
        q = q.to(tl.float32)
    m = tl.full([LP], float("-inf"), tl.float32)
    l_sum = tl.zeros([LP], tl.float32)
    acc = tl.zeros([LP, DH], tl.float32)
    kv = bh * S * DH
    for start in range(lo, hi, BLOCK):
        keys = start + tl.arange(0, BLOCK)
        live = keys < hi
        k = tl.load(K + kv + keys[:, None] * DH + d[None, :], mask=live[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        s = tl.dot(q, tl.trans(k)) * scale_log2  # [LP, BLOCK], base 2
        s = tl.where(live[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
        alpha = tl.exp2(m - m_new)
        p = tl.exp2(s - m_new[:, None])
        v = tl.load(V + kv + keys[:, None] * DH + d[None, :], mask=live[:, None], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        l_sum = l_sum * alpha + tl.sum(p, 1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v)
        m = m_new
    seen = l_sum > 0.0
    part = OUT_P + (bh * NSPLIT + split) * (LP * DH)
    tl.store(part + rows[:, None] * DH + d[None, :], acc / tl.where(seen, l_sum, 1.0)[:, None])
    lse = tl.where(seen, m + tl.log2(tl.where(seen, l_sum, 1.0)), float("-inf"))
    tl.store(LSE_P + (bh * NSPLIT + split) * LP + rows, lse)


@triton.jit
def _merge(OUT_P, LSE_P, OUT, L: tl.constexpr, LP: tl.constexpr, DH: tl.constexpr, NSPLIT: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    rows = tl.arange(0, LP)
    d = tl.arange(0, DH)
    m = tl.full([LP], float("-inf"), tl.float32)
    w_sum = tl.zeros([LP], tl.float32)
    acc = tl.zeros([LP, DH], tl.float32)
    for s in range(NSPLIT):
        lse = tl.load(LSE_P + (bh * NSPLIT + s) * LP + rows)
        part = tl.load(OUT_P + (bh * NSPLIT + s) * (LP * DH) + rows[:, None] * DH + d[None, :])
        m_new = tl.maximum(m, lse)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        w = tl.where(lse > float("-inf"), tl.exp2(lse - m_safe), 0.0)
        w_sum = w_sum * alpha + w
        acc = acc * alpha[:, None] + w[:, None] * part
        m = m_new
    out = acc / tl.where(w_sum > 0.0, w_sum, 1.0)[:, None]
    tl.store(OUT + bh * (L * DH) + rows[:, None] * DH + d[None, :], out.to(OUT.dtype.element_ty), mask=rows[:, None] < L)


# ---------------------------------------------------------------------------------------------
# launcher


def unavailable_reason(q: torch.Tensor) -> str | None:
    """None when the kernel serves these queries (bf16/fp16 on a GPU, or on the CPU under the
    interpreter), else why not (the drafter then uses torch's SDPA)."""
    if q.dtype not in (torch.bfloat16, torch.float16):
        return f"dtype {q.dtype} (the kernel takes bf16/fp16)"
    if q.device.type == "cuda" or (q.device.type == "cpu" and INTERPRETED):
        return None
    return f"no triton on {q.device.type} outside the interpreter"


def nsplit_for(capacity: int) -> int:
    """Splits for a cache of `capacity` keys: about KEYS_PER_SPLIT keys each, at most MAX_SPLITS."""
    return max(1, min(MAX_SPLITS, math.ceil(capacity / KEYS_PER_SPLIT)))


def check_inputs(q, k, v, lengths) -> None:
    if q.dim() != 4 or k.dim() != 4 or k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[3] != q.shape[3]:
        raise ValueError(f"q/k/v: expected [B, Hd, L, dh] and two [B, Hd, S, dh], got {list(q.shape)}, {list(k.shape)}, {list(v.shape)}")
    if k.dtype != q.dtype or v.dtype != q.dtype:
        raise ValueError(f"k/v: expected dtype {q.dtype}, got {k.dtype} and {v.dtype}")
    dh = q.shape[3]
    if dh < 16 or dh & (dh - 1):
        raise ValueError(f"q: expected a power-of-two head dim >= 16, got {dh}")
    if lengths.shape != (q.shape[0],) or lengths.dtype != torch.int32:
        raise ValueError(f"lengths: expected int32 [B={q.shape[0]}], got {lengths.dtype} {list(lengths.shape)}")


def draft_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor, nsplit: int | None = None) -> torch.Tensor:
    """Attention of q over keys 0 .. lengths[b] + L - 1 of k/v (see the module docstring)."""
    check_inputs(q, k, v, lengths)
    B, HD, L, DH = q.shape
    S = k.shape[2]
    nsplit = nsplit or nsplit_for(S)
    LP = max(16, triton.next_power_of_2(L))
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out_p = torch.empty(B * HD, nsplit, LP, DH, dtype=torch.float32, device=q.device)
    lse_p = torch.empty(B * HD, nsplit, LP, dtype=torch.float32, device=q.device)
    out = torch.empty_like(q)
    scale = DH**-0.5 * LOG2E
    _split[(B * HD, nsplit)](q, k, v, lengths, out_p, lse_p, scale, S, HD=HD, L=L, LP=LP, DH=DH, EXTRA=L,
                             NSPLIT=nsplit, BLOCK=BLOCK_N, UPCAST=INTERPRETED, num_warps=4)
    _merge[(B * HD,)](out_p, lse_p, out, L=L, LP=LP, DH=DH, NSPLIT=nsplit, num_warps=4)
    return out


__all__ = ["draft_attention", "nsplit_for", "unavailable_reason"]
