"""The `triton_extend` backend: the seed's baseline, an SGLang-style extend-attention kernel.

Grid (H, ceil(T / BLOCK_M), B): one program per (head, block of tree tokens) walks the whole
committed prefix and then the tree tail (with the ancestor mask) of its sequence, with no KV split.
It is correct and uses tl.dot, but it is structurally per head: each of the H * ceil(T / BLOCK_M)
programs of a sequence reads all of its KV, and a T=16, H=8 call keeps only 8 SMs busy. It exists so
benchmarks can show the distance to the split-KV `triton` backend and so history starts where the
seed did. The KV tile step (attend_tile) is shared with the `triton` backend, so an A/B between the
two measures the schedule, not the tile math.

    q [B, T, H, 576] bf16 -> out [B, T, H, 512] bf16, lse [B, T, H] fp32 (natural log, optional)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdengine import env
from kdengine.ops import triton_verify
from kdengine.ops.triton_verify import D_NOPE, D_ROPE, DV, LOG2E, attend_tile, unavailable_reason

# fixed when @triton.jit runs, at import (attend_tile's too)
INTERPRETED = env.triton_interpret() and triton_verify.INTERPRETED


@triton.jit
def _extend_kernel(
    Q, KV, PT, PREFIX, MASK, OUT, LSE,
    qk_scale, T, H,
    stride_q_b, stride_q_t, stride_kv_page, stride_pt_b, stride_mask_b, stride_mask_t,
    stride_o_b, stride_o_t, stride_l_b, stride_l_t,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, WRITE_LSE: tl.constexpr, UPCAST: tl.constexpr,
):
    """Grid (H, ceil(T / BLOCK_M), B): tree tokens [pid_t * BLOCK_M, +BLOCK_M) of head h, sequence b."""
    h = tl.program_id(0)
    b = tl.program_id(2).to(tl.int64)
    t_idx = tl.program_id(1) * BLOCK_M + tl.arange(0, BLOCK_M)
    row_ok = t_idx < T
    prefix = tl.load(PREFIX + b)
    total = prefix + T
    tree_from = (prefix // BLOCK_N) * BLOCK_N  # first tile holding a tree token

    q_row = Q + b * stride_q_b + t_idx.to(tl.int64)[:, None] * stride_q_t + h * (D_NOPE + D_ROPE)
    q_nope = tl.load(q_row + tl.arange(0, D_NOPE)[None, :], mask=row_ok[:, None], other=0.0)
    q_rope = tl.load(q_row + D_NOPE + tl.arange(0, D_ROPE)[None, :], mask=row_ok[:, None], other=0.0)

    acc = tl.zeros([BLOCK_M, D_NOPE], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    PT_row = PT + b * stride_pt_b
    MASK_row = MASK + b * stride_mask_b
    for n0 in range(0, tree_from, BLOCK_N):  # the whole committed prefix, no mask
        acc, m_i, l_i = attend_tile(
            acc, m_i, l_i, q_nope, q_rope, KV, stride_kv_page, PT_row, MASK_row, stride_mask_t,
            n0, total, prefix, T, t_idx, row_ok, qk_scale,
            PAGE_SIZE, BLOCK_M, BLOCK_N, D_NOPE, D_ROPE, False, UPCAST,
        )
    for n0 in range(tree_from, total, BLOCK_N):  # tree tail: ancestor mask
        acc, m_i, l_i = attend_tile(
            acc, m_i, l_i, q_nope, q_rope, KV, stride_kv_page, PT_row, MASK_row, stride_mask_t,
            n0, total, prefix, T, t_idx, row_ok, qk_scale,
            PAGE_SIZE, BLOCK_M, BLOCK_N, D_NOPE, D_ROPE, True, UPCAST,
        )

    # every tree token sees itself, so l_i > 0 on each stored row
    out = acc / tl.where(row_ok, l_i, 1.0)[:, None]
    o_row = OUT + b * stride_o_b + t_idx.to(tl.int64)[:, None] * stride_o_t + h * D_NOPE
    tl.store(o_row + tl.arange(0, D_NOPE)[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        lse = (m_i + tl.log2(tl.where(row_ok, l_i, 1.0))) * 0.6931471805599453  # natural log
        tl.store(LSE + b * stride_l_b + t_idx.to(tl.int64) * stride_l_t + h, lse, mask=row_ok)


def available(device: torch.device) -> str | None:
    """None when this backend can run on `device`, else why not (same rules as `triton`)."""
    return unavailable_reason(device, INTERPRETED, __name__)


def config(device: torch.device, T: int) -> dict:
    """SGLang's extend kernel takes (BLOCK_M, BLOCK_N) = (32, 64) and 8 warps for 576-dim heads on
    sm_80+; here BLOCK_N is 32 (attend_tile reads at most two mask words per row) and BLOCK_M drops to
    16 when the whole tree fits, so a T=16 call does not compute 16 padding rows."""
    return {"BLOCK_M": 16 if T <= 16 else 32, "BLOCK_N": 32, "num_warps": 8 if T > 16 else 4, "num_stages": 2}


def run(q, kv_cache, page_table, prefix_len, mask_bits, *, sm_scale, nsplit, return_lse, out=None, lse=None):
    """q [B, T, H, 576] bf16 -> (out [B, T, H, DV] bf16, lse [B, T, H] fp32 or None). `nsplit` is
    ignored: this kernel does not split the KV. `out` / `lse` let tests hand in poisoned buffers."""
    B, T, H, _ = q.shape
    cfg = config(q.device, T)
    page_size = kv_cache.shape[1]
    if out is None:
        out = torch.empty(B, T, H, DV, dtype=q.dtype, device=q.device)
    if return_lse and lse is None:
        lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    lse_arg = lse if return_lse else out  # never written when WRITE_LSE is False
    _extend_kernel[(H, triton.cdiv(T, cfg["BLOCK_M"]), B)](
        q, kv_cache, page_table, prefix_len, mask_bits, out, lse_arg,
        float(sm_scale) * LOG2E, T, H,
        q.stride(0), q.stride(1), kv_cache.stride(0), page_table.stride(0), mask_bits.stride(0),
        mask_bits.stride(1), out.stride(0), out.stride(1), lse_arg.stride(0), lse_arg.stride(1),
        PAGE_SIZE=page_size, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=min(cfg["BLOCK_N"], page_size),
        D_NOPE=D_NOPE, D_ROPE=D_ROPE, WRITE_LSE=return_lse, UPCAST=INTERPRETED,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    return out, (lse if return_lse else None)
