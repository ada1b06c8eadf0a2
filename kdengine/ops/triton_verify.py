"""The `triton` backend: split-KV tree-verify attention for MLA, then a log-sum-exp merge.

MLA has one latent KV head, so every query row of a sequence (row r = t * H + h, R = T * H rows)
attends to the same KV rows. The split kernel runs on the grid (row_tiles, NSPLIT, B):

  * NSPLIT cuts sequence b's prefix_len[b] + T tokens into equal chunks. The chunk length is computed
    on the device from prefix_len, so the grid depends on host sizes only and one CUDA graph replays
    at any prefix length up to the page-table capacity. Splits are whole tiles; a split with no tokens
    writes lse = -inf (and a zero partial) and the merge ignores it.
  * A program holds BLOCK_M query rows (Q [BLOCK_M, 576] and an fp32 accumulator [BLOCK_M, 512]) and
    walks its split in BLOCK_N-token tiles (a tile lies inside one page: one page-table lookup,
    contiguous 16-byte loads), S = Q_nope K_nope^T + Q_rope K_rope^T with tl.dot, online softmax in base 2 (log2(e) folded into the scale), acc += P V with V = K_nope.
    The prefix tiles apply no mask; the tree tiles read the packed ancestor mask.
  * Rows of a sequence do not fit one program at large T * H (Q alone is T*H*576*2 bytes), so they
    are tiled; row tiles are the fastest grid axis, so the row tiles of one KV split run at the same
    time and their repeat reads of a KV tile hit L2. Counted in DRAM bytes, the KV is read about once;
    in load instructions (L2 -> SM) it is read row_tiles times.

The merge kernel combines the NSPLIT partials of each row (out_partial fp32 [B, R, NSPLIT, 512],
lse_partial fp32 [B, R, NSPLIT], base 2) into out bf16 [B, T, H, 512] and lse fp32 [B, T, H] (natural
log). run() never reads a device value on the host: no sync, CUDA-graph capturable.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from kdengine import env
from kdengine.ops.schedule import resolve_nsplit

D_NOPE, D_ROPE = 512, 64  # latent (also V) dims and rope dims of a 576-dim row
DV = D_NOPE
LOG2E = 1.4426950408889634

# KV tokens per tile: at most 32 so a tile reads at most two mask words per row (attend_tile), and
# never more than a page (a tile is one page-table lookup and contiguous rows).
BLOCK_N = 32

# Triton decides interpreter or compiler when @triton.jit runs, i.e. when this module is imported.
INTERPRETED = env.triton_interpret()
UPCAST_DOT = INTERPRETED  # see dot()


# ---------------------------------------------------------------------------------------------
# kernels


@triton.jit
def dot(a, b, acc, UPCAST: tl.constexpr):
    """acc + a @ b. UPCAST (interpreter only): Triton 3.9's interpreter multiplies bf16 operands as
    their raw uint16 bits, so it gets fp32 copies; compiled kernels always take the bf16 tensor-core path."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    return tl.dot(a, b, acc)


@triton.jit
def attend_tile(
    acc, m_i, l_i,  # [BLOCK_M, D_NOPE] fp32, [BLOCK_M] fp32 (base-2 running max), [BLOCK_M] fp32
    q_nope, q_rope,  # [BLOCK_M, D_NOPE], [BLOCK_M, D_ROPE] bf16
    KV, stride_kv_page, PT_row, MASK_row, stride_mask_t,
    n0, end, prefix, T, t_idx, row_ok, qk_scale,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, TREE: tl.constexpr, UPCAST: tl.constexpr,
):
    """Fold KV tile [n0, n0 + BLOCK_N) into the online softmax. n0 is a multiple of BLOCK_N and
    BLOCK_N divides PAGE_SIZE, so the tile is BLOCK_N consecutive rows of one page: one page-table
    lookup, contiguous 16-byte loads. Prefix tiles (TREE=False) are always whole and unmasked; a tree
    tile drops tokens >= end and applies the ancestor mask to tokens >= prefix."""
    tl.static_assert(BLOCK_N <= 32)
    tl.static_assert(PAGE_SIZE % BLOCK_N == 0)
    page = tl.load(PT_row + n0 // PAGE_SIZE).to(tl.int64)
    tile = KV + page * stride_kv_page + (n0 % PAGE_SIZE) * (D_NOPE + D_ROPE)
    tok = tl.arange(0, BLOCK_N)
    kv_ptr = tile + tok[:, None] * (D_NOPE + D_ROPE)  # [BLOCK_N, 1]
    if TREE:
        pos = n0 + tok
        pos_ok = pos < end
        k_nope = tl.load(kv_ptr + tl.arange(0, D_NOPE)[None, :], mask=pos_ok[:, None], other=0.0)
        k_rope = tl.load(kv_ptr + D_NOPE + tl.arange(0, D_ROPE)[None, :], mask=pos_ok[:, None], other=0.0)
    else:
        k_nope = tl.load(kv_ptr + tl.arange(0, D_NOPE)[None, :])  # [BLOCK_N, D_NOPE], also V
        k_rope = tl.load(kv_ptr + D_NOPE + tl.arange(0, D_ROPE)[None, :])  # [BLOCK_N, D_ROPE]
    s = dot(q_nope, tl.trans(k_nope), tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32), UPCAST)
    s = dot(q_rope, tl.trans(k_rope), s, UPCAST)
    s = s * qk_scale  # [BLOCK_M, BLOCK_N], base-2 logits
    if TREE:
        # The tile spans BLOCK_N <= 32 tree columns, so at most two mask words per query row.
        col = pos - prefix  # tree column j; < 0 for prefix tokens sharing the tile
        w0 = tl.maximum(n0 - prefix, 0) // 32
        lo = tl.load(MASK_row + t_idx * stride_mask_t + w0, mask=row_ok, other=0)  # [BLOCK_M]
        hi = tl.load(MASK_row + t_idx * stride_mask_t + w0 + 1, mask=row_ok & (t_idx * 0 + (w0 + 1) * 32 < T), other=0)
        word = tl.where((col // 32 == w0)[None, :], lo[:, None], hi[:, None])  # [BLOCK_M, BLOCK_N]
        bit = (word >> (col % 32)[None, :]) & 1
        visible = pos_ok[None, :] & ((col < 0)[None, :] | (bit != 0))
        s = tl.where(visible, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row that has seen nothing yet
    alpha = tl.exp2(m_i - m_safe)
    p = tl.exp2(s - m_safe[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None]
    acc = dot(p.to(k_nope.dtype), k_nope, acc, UPCAST)
    return acc, m_new, l_i


@triton.jit
def _split_kernel(
    Q, KV, PT, PREFIX, MASK, OUT_P, LSE_P,
    qk_scale, T, H, nsplit,
    stride_q_b, stride_kv_page, stride_pt_b, stride_mask_b, stride_mask_t,
    stride_op_b, stride_op_r, stride_lp_b,
    PAGE_SIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    D_NOPE: tl.constexpr, D_ROPE: tl.constexpr, UPCAST: tl.constexpr,
):
    """Grid (row_tiles, NSPLIT, B): rows [pid_m * BLOCK_M, +BLOCK_M) of sequence b over KV split s."""
    pid_m = tl.program_id(0)
    split = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    prefix = tl.load(PREFIX + b)
    total = prefix + T
    chunk = tl.cdiv(tl.cdiv(total, nsplit), BLOCK_N) * BLOCK_N  # whole tiles per split
    start = split * chunk
    end = tl.minimum(start + chunk, total)  # <= start: an empty split
    tree_from = (prefix // BLOCK_N) * BLOCK_N  # first tile holding a tree token

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)  # r = t * H + h
    row_ok = rows < T * H
    t_idx = rows // H
    q_row = Q + b * stride_q_b + rows.to(tl.int64)[:, None] * (D_NOPE + D_ROPE)
    q_nope = tl.load(q_row + tl.arange(0, D_NOPE)[None, :], mask=row_ok[:, None], other=0.0)
    q_rope = tl.load(q_row + D_NOPE + tl.arange(0, D_ROPE)[None, :], mask=row_ok[:, None], other=0.0)

    acc = tl.zeros([BLOCK_M, D_NOPE], dtype=tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    PT_row = PT + b * stride_pt_b
    MASK_row = MASK + b * stride_mask_b
    for n0 in range(start, tl.minimum(end, tree_from), BLOCK_N):  # committed prefix: no mask
        acc, m_i, l_i = attend_tile(
            acc, m_i, l_i, q_nope, q_rope, KV, stride_kv_page, PT_row, MASK_row, stride_mask_t,
            n0, end, prefix, T, t_idx, row_ok, qk_scale,
            PAGE_SIZE, BLOCK_M, BLOCK_N, D_NOPE, D_ROPE, False, UPCAST,
        )
    for n0 in range(tl.maximum(start, tree_from), end, BLOCK_N):  # tree tail: ancestor mask
        acc, m_i, l_i = attend_tile(
            acc, m_i, l_i, q_nope, q_rope, KV, stride_kv_page, PT_row, MASK_row, stride_mask_t,
            n0, end, prefix, T, t_idx, row_ok, qk_scale,
            PAGE_SIZE, BLOCK_M, BLOCK_N, D_NOPE, D_ROPE, True, UPCAST,
        )

    seen = l_i > 0.0  # False for an empty split, or a split holding only tree tokens the row cannot see
    out = acc / tl.where(seen, l_i, 1.0)[:, None]
    lse = tl.where(seen, m_i + tl.log2(tl.where(seen, l_i, 1.0)), float("-inf"))
    op = OUT_P + b * stride_op_b + rows.to(tl.int64)[:, None] * stride_op_r + split * D_NOPE
    tl.store(op + tl.arange(0, D_NOPE)[None, :], out, mask=row_ok[:, None])
    tl.store(LSE_P + b * stride_lp_b + rows.to(tl.int64) * nsplit + split, lse, mask=row_ok)


@triton.jit
def _merge_kernel(
    OUT_P, LSE_P, OUT, LSE, n_rows, nsplit,
    WRITE_LSE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_DV: tl.constexpr,
    DV: tl.constexpr,
):
    """Grid (cdiv(B * R, BLOCK_R), DV // BLOCK_DV): merge the splits of BLOCK_R rows, one slice of DV."""
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)  # flat over [B, R]
    row_ok = rows < n_rows
    dv = tl.program_id(1) * BLOCK_DV + tl.arange(0, BLOCK_DV)
    m = tl.full([BLOCK_R], float("-inf"), dtype=tl.float32)  # base-2 running max of the split lse
    w_sum = tl.zeros([BLOCK_R], dtype=tl.float32)
    acc = tl.zeros([BLOCK_R, BLOCK_DV], dtype=tl.float32)
    for s0 in range(0, nsplit, BLOCK_S):
        s = s0 + tl.arange(0, BLOCK_S)
        idx = rows[:, None] * nsplit + s[None, :]  # [BLOCK_R, BLOCK_S]
        lse = tl.load(LSE_P + idx, mask=row_ok[:, None] & (s < nsplit)[None, :], other=float("-inf"))
        live = lse > float("-inf")
        # dead splits are never read: their partial output is undefined
        part = tl.load(OUT_P + idx[:, :, None] * DV + dv[None, None, :], mask=live[:, :, None], other=0.0)
        m_new = tl.maximum(m, tl.max(lse, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m - m_safe)
        w = tl.where(live, tl.exp2(lse - m_safe[:, None]), 0.0)  # [BLOCK_R, BLOCK_S]
        w_sum = w_sum * alpha + tl.sum(w, 1)
        acc = acc * alpha[:, None] + tl.sum(w[:, :, None] * part, 1)
        m = m_new
    seen = w_sum > 0.0
    out = acc / tl.where(seen, w_sum, 1.0)[:, None]
    tl.store(OUT + rows[:, None] * DV + dv[None, :], out.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        if tl.program_id(1) == 0:
            lse_row = tl.where(seen, m + tl.log2(tl.where(seen, w_sum, 1.0)), float("-inf"))
            tl.store(LSE + rows, lse_row * 0.6931471805599453, mask=row_ok)  # natural log


# ---------------------------------------------------------------------------------------------
# launcher


def unavailable_reason(device: torch.device, interpreted: bool, module: str) -> str | None:
    """Shared by both Triton backends; `interpreted`: whether `module`'s kernels were built for the
    interpreter (at its import)."""
    if device.type == "cuda":
        return None
    if device.type == "cpu":
        if not env.triton_interpret():
            return "triton runs on the CPU only in its interpreter (set TRITON_INTERPRET=1 before importing kdengine)"
        if not interpreted:
            return f"TRITON_INTERPRET=1 was set after {module} was imported; set it before"
        return None
    return f"no triton support for device type {device.type!r}"


def available(device: torch.device) -> str | None:
    """None when this backend can run on `device`, else why not."""
    return unavailable_reason(device, INTERPRETED, __name__)


def config(device: torch.device) -> dict:
    """Rows per program, KV tokens per tile, warps and pipeline stages for `device`.

    sm_90: 64 rows make both dots wgmma-sized (M = 64 per warpgroup) and halve the L2 re-reads of a
    KV tile against 32 rows; the [64, 512] fp32 accumulator needs 8 warps (128 registers a thread).
    Q (72 KB) plus two pipelined 32-token KV tiles (2 x 36 KB) take ~148 KB of shared memory; 64-token
    tiles would need ~237 KB, over the 227 KB limit. Elsewhere (sm_80; sm_120 with <= 99 KB of shared
    memory a block; the interpreter): 32 rows with mma.sync, 8 warps, ~76 KB, no register spills.
    """
    if device.type == "cuda" and torch.cuda.get_device_capability(device)[0] == 9:
        return {"BLOCK_M": 64, "BLOCK_N": BLOCK_N, "num_warps": 8, "num_stages": 2}
    return {"BLOCK_M": 32, "BLOCK_N": BLOCK_N, "num_warps": 8, "num_stages": 2}


def merge_config(device: torch.device) -> dict:
    """Rows, splits and value dims per merge step. Compiled: one row and a quarter of DV per program,
    so a T=16, H=8 call still has 512 programs streaming the partials. The interpreter pays per
    program and per op, so it takes many rows and all of DV at once."""
    if device.type == "cuda":
        return {"BLOCK_R": 1, "BLOCK_S": 8, "BLOCK_DV": 128, "num_warps": 4}
    return {"BLOCK_R": 16, "BLOCK_S": 8, "BLOCK_DV": DV, "num_warps": 4}


def row_tiles(T: int, H: int, block_m: int) -> int:
    return math.ceil(T * H / block_m)


def alloc_partials(B: int, R: int, nsplit: int, device: torch.device):
    """out_partial fp32 [B, R, NSPLIT, DV] and lse_partial fp32 [B, R, NSPLIT] (base-2 log)."""
    out_p = torch.empty(B, R, nsplit, DV, dtype=torch.float32, device=device)
    lse_p = torch.empty(B, R, nsplit, dtype=torch.float32, device=device)
    return out_p, lse_p


def run(q, kv_cache, page_table, prefix_len, mask_bits, *, sm_scale, nsplit, return_lse, out=None, lse=None):
    """q [B, T, H, 576] bf16 -> (out [B, T, H, DV] bf16, lse [B, T, H] fp32 or None).

    Inputs are validated by verify_attention. `out` / `lse` let tests hand in poisoned buffers.
    """
    B, T, H, _ = q.shape
    R = T * H
    cfg = config(q.device)
    tiles = row_tiles(T, H, cfg["BLOCK_M"])
    page_size = kv_cache.shape[1]
    block_n = min(cfg["BLOCK_N"], page_size)  # a tile never straddles two pages
    n = resolve_nsplit(
        nsplit, backend="triton", capacity=page_table.shape[1] * page_size, batch=B, row_tiles=tiles,
        device=q.device,
    )
    out_p, lse_p = alloc_partials(B, R, n, q.device)
    _split_kernel[(tiles, n, B)](
        q, kv_cache, page_table, prefix_len, mask_bits, out_p, lse_p,
        float(sm_scale) * LOG2E, T, H, n,
        q.stride(0), kv_cache.stride(0), page_table.stride(0), mask_bits.stride(0), mask_bits.stride(1),
        out_p.stride(0), out_p.stride(1), lse_p.stride(0),
        PAGE_SIZE=page_size, BLOCK_M=cfg["BLOCK_M"], BLOCK_N=block_n, D_NOPE=D_NOPE, D_ROPE=D_ROPE, UPCAST=UPCAST_DOT,
        num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )
    if out is None:
        out = torch.empty(B, T, H, DV, dtype=q.dtype, device=q.device)
    if return_lse and lse is None:
        lse = torch.empty(B, T, H, dtype=torch.float32, device=q.device)
    mcfg = merge_config(q.device)
    _merge_kernel[(triton.cdiv(B * R, mcfg["BLOCK_R"]), DV // mcfg["BLOCK_DV"])](
        out_p, lse_p, out, lse if return_lse else lse_p, B * R, n, WRITE_LSE=return_lse, DV=DV, **mcfg,
    )
    return out, (lse if return_lse else None)
