"""Fused per-layer glue of the target forward (Triton), one launch where torch takes many:

  rms_norm(x, weight, eps)        x [..., D] -> x * rsqrt(mean(x^2) + eps) * weight, fp32 math, x.dtype out
  add_rms_norm(x, y, weight, eps) the residual add and the next norm: (s = x + y in x.dtype, rms_norm(s))
  rms_norm_pair(x, wa, wb, eps)   two norms over the first DA and the next DB columns of x [..., >= DA + DB]
                                  (read in place: the MLA down-projection's q and kv parts) -> two tensors
  moe_route(logits, bias, k, scale) the router after its GEMM: top-k of sigmoid(logits) + bias per token,
                                  the chosen sigmoid scores normalised to sum 1, times scale
  moe_plan(ids, lo, E, load)      the grouped GEMM's plan from global expert ids [N, k]: slots of this rank's
                                  experts sorted by expert (stable), other ranks' slots last; rows, inverse,
                                  end offsets, valid mask; each expert's count added to load [E]
  moe_combine(y, inv, w, valid)   out[n] = sum_j valid[n, j] * w[n, j] * y[inv[n, j]] (fp32 sum in slot
                                  order, y.dtype out): the routed experts' rows, sorted by expert, back
                                  to their tokens; rows of invalid slots are never read
  mla_rope_pack(q_lat, q, latent, k_pe, cos, sin, pool, page_table, slots, page_size)
      q_lat [H, B*T, C], q [B, T, H, QH] (rope part last), latent [B, T, C], k_pe [B, T, R], cos/sin [B, T, R]
      -> q_abs [B, T, H, C + R] bf16 (absorbed query: latent part, then the rotated rope part), and the
         KV row [latent, rotated k_pe] written into pool (one layer [P, page_size, C + R]) at slot
         slots[b, t] through the page table (kdengine.engine.kv_cache.PagedKVCache.write).

Rope is the HF DeepseekV3 one (kdengine.engine.model.apply_rope): de-interleave the pairs, then
rotate-half, with the caller's cos/sin tables (torch's accurate cos/sin, computed once per forward).
Used where fused_available() says so (a GPU, or the CPU under TRITON_INTERPRET=1 for the tests); the
torch ops are the definition and stay the path elsewhere. No host sync: graph-capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdengine import env

INTERPRETED = env.triton_interpret()  # Triton picks interpreter or compiler when @triton.jit runs


# ---------------------------------------------------------------------------------------------
# kernels


@triton.jit
def _store_normed(x, W, OUT, d, inside, D: tl.constexpr, eps):
    """OUT[d] = x * rsqrt(mean(x^2) + eps) * W[d] for one row x (fp32, zero outside `inside`)."""
    r = tl.rsqrt(tl.sum(x * x, 0) / D + eps)
    w = tl.load(W + d, mask=inside, other=0.0).to(tl.float32)
    tl.store(OUT + d, ((x * r) * w).to(OUT.dtype.element_ty), mask=inside)


@triton.jit
def _rms_norm(X, W, OUT, eps, D: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK)
    inside = d < D
    x = tl.load(X + row * D + d, mask=inside, other=0.0).to(tl.float32)
    _store_normed(x, W, OUT + row * D, d, inside, D, eps)


@triton.jit
def _add_rms_norm(X, Y, S, W, OUT, eps, D: tl.constexpr, BLOCK: tl.constexpr, F64: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, BLOCK)
    inside = d < D
    x = tl.load(X + row * D + d, mask=inside, other=0.0)
    y = tl.load(Y + row * D + d, mask=inside, other=0.0)
    if F64:
        s = x + y
    else:  # the residual stream, rounded as torch's x + y rounds it (fp32 sum, one rounding)
        s = (x.to(tl.float32) + y.to(tl.float32)).to(S.dtype.element_ty)
    tl.store(S + row * D + d, s, mask=inside)
    _store_normed(s.to(tl.float32), W, OUT + row * D, d, inside, D, eps)


@triton.jit
def _rms_norm_pair(X, WA, WB, OA, OB, stride, eps_a, eps_b, DA: tl.constexpr, DB: tl.constexpr,
                   BA: tl.constexpr, BB: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    a = tl.arange(0, BA)
    ia = a < DA
    xa = tl.load(X + row * stride + a, mask=ia, other=0.0).to(tl.float32)
    _store_normed(xa, WA, OA + row * DA, a, ia, DA, eps_a)
    b = tl.arange(0, BB)
    ib = b < DB
    xb = tl.load(X + row * stride + DA + b, mask=ib, other=0.0).to(tl.float32)
    _store_normed(xb, WB, OB + row * DB, b, ib, DB, eps_b)


@triton.jit
def _shr(z, s: tl.constexpr):
    return (z >> s) & ((1 << (64 - s)) - 1)  # logical shift of int64 (kdengine.engine.moe._shr)


@triton.jit
def _moe_route(LOGITS, BIAS, LOGP, CALLS, SALT, IDS, W, n_experts, scale, golden, mix1, mix2,
               K: tl.constexpr, KP: tl.constexpr, BLOCK: tl.constexpr, DRAW: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    e = tl.arange(0, BLOCK)
    inside = e < n_experts
    score = tl.sigmoid(tl.load(LOGITS + n * n_experts + e, mask=inside, other=0.0).to(tl.float32))
    if DRAW:  # Gumbel top-k over log_p, noise from the counter hash (kdengine.engine.moe.hash_uniform)
        z = (tl.load(CALLS) * 1_000_003 + tl.load(SALT)) * 1_000_000_007 + n * 65_537
        z = z * n_experts + e.to(tl.int64) + golden
        z = (z ^ _shr(z, 30)) * mix1
        z = (z ^ _shr(z, 27)) * mix2
        z = z ^ _shr(z, 31)
        u = (_shr(z, 40).to(tl.float32) + 0.5) / 16777216.0
        u = tl.minimum(tl.maximum(u, 1e-7), 1 - 1e-7)
        key = tl.load(LOGP + e, mask=inside, other=0.0) - tl.log(-tl.log(u))
    else:
        key = score + tl.load(BIAS + e, mask=inside, other=0.0)
    sel = tl.where(inside, key, float("-inf"))
    slot = tl.arange(0, KP)
    ids = tl.zeros([KP], dtype=tl.int32)
    w = tl.zeros([KP], dtype=tl.float32)
    for j in tl.static_range(K):  # top-k by repeated max; ties go to the lowest expert id
        best = tl.max(sel, 0)
        pick = tl.min(tl.where(sel == best, e, BLOCK), 0)
        ids = tl.where(slot == j, pick, ids)
        w = tl.where(slot == j, tl.sum(tl.where(e == pick, score, 0.0), 0), w)
        sel = tl.where(e == pick, float("-inf"), sel)
    tl.store(IDS + n * K + slot, ids.to(tl.int64), mask=slot < K)
    tl.store(W + n * K + slot, w / tl.sum(w, 0) * scale, mask=slot < K)


@triton.jit
def _moe_plan(IDS, ROWS, INV, OFFS, VALID, LOAD, NK, lo, E, K: tl.constexpr, BLOCK: tl.constexpr):
    """One program: a counting sort of the NK slots by local expert (stable), other ranks' slots last."""
    a = tl.arange(0, BLOCK)
    live = a < NK
    local = tl.load(IDS + a, mask=live, other=0) - lo
    valid = live & (local >= 0) & (local < E)
    key = tl.where(valid, local, E)
    key = tl.where(live, key, E + 1)
    pos = tl.zeros([BLOCK], dtype=tl.int32)
    start = tl.sum(pos, 0)  # an int32 zero
    for x in range(0, E + 1):  # expert x's slots take the next count[x] positions, in slot order
        m = (key == x).to(tl.int32)
        pos = tl.where(key == x, start + tl.cumsum(m, 0) - 1, pos)
        cnt = tl.sum(m, 0)
        start += cnt
        if x < E:
            tl.store(OFFS + x, start)
            tl.store(LOAD + x, tl.load(LOAD + x) + cnt.to(tl.float32))
    tl.store(ROWS + pos, (a // K).to(tl.int64), mask=live)
    tl.store(INV + a, pos.to(tl.int64), mask=live)
    tl.store(VALID + a, valid.to(tl.int8), mask=live)


@triton.jit
def _moe_combine(Y, INV, W, VALID, OUT, D, K: tl.constexpr, BLOCK: tl.constexpr):
    n = tl.program_id(0).to(tl.int64)
    d = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    inside = d < D
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(K):
        ok = tl.load(VALID + n * K + j).to(tl.int32)  # 1 or 0
        slot = tl.load(INV + n * K + j).to(tl.int64)
        wt = tl.load(W + n * K + j).to(tl.float32) * ok.to(tl.float32)
        row = tl.load(Y + slot * D + d, mask=d < D * ok, other=0.0).to(tl.float32)  # invalid: nothing read
        acc += wt * row
    tl.store(OUT + n * D + d, acc.to(OUT.dtype.element_ty), mask=inside)


@triton.jit
def _rope_half(x_even, x_odd, c, s):
    """HF rope on one 64-dim row given as its even and odd elements [.., R/2]: (first, second) halves."""
    return x_even * c - x_odd * s, x_odd * c + x_even * s


@triton.jit
def _mla_rope_pack(
    QLAT, Q, LAT, KPE, COS, SIN, QABS, POOL, PAGES, SLOTS, max_pages, T, BT, kpe_stride,
    H: tl.constexpr, HP: tl.constexpr, C: tl.constexpr, R: tl.constexpr, QH: tl.constexpr, NOPE: tl.constexpr,
    PAGE: tl.constexpr,
):
    bt = tl.program_id(0).to(tl.int64)  # one (sequence, token): row b * T + t
    h = tl.arange(0, HP)
    hm = h < H
    c = tl.arange(0, C)
    i = tl.arange(0, R // 2)
    out = QABS + bt * (H * (C + R)) + h[:, None] * (C + R)
    # absorbed query: the latent part (heads-major q_lat [H, B*T, C]) copied, the rope part rotated
    qlat = tl.load(QLAT + h[:, None] * (BT * C) + bt * C + c[None, :], mask=hm[:, None], other=0.0)
    tl.store(out + c[None, :], qlat.to(QABS.dtype.element_ty), mask=hm[:, None])
    cos = tl.load(COS + bt * R + i)[None, :]  # the tables' two halves are equal (cat([freqs, freqs]))
    sin = tl.load(SIN + bt * R + i)[None, :]
    qpe = Q + bt * (H * QH) + h[:, None] * QH + NOPE
    qe = tl.load(qpe + 2 * i[None, :], mask=hm[:, None], other=0.0).to(tl.float32)
    qo = tl.load(qpe + 2 * i[None, :] + 1, mask=hm[:, None], other=0.0).to(tl.float32)
    tl.store(out + C + i[None, :], (qe * cos - qo * sin).to(QABS.dtype.element_ty), mask=hm[:, None])
    tl.store(out + C + R // 2 + i[None, :], (qo * cos + qe * sin).to(QABS.dtype.element_ty), mask=hm[:, None])
    # the KV row [latent, rotated k_pe] into its page
    ke = tl.load(KPE + bt * kpe_stride + 2 * i[None, :]).to(tl.float32)
    ko = tl.load(KPE + bt * kpe_stride + 2 * i[None, :] + 1).to(tl.float32)
    slot = tl.load(SLOTS + bt)
    page = tl.load(PAGES + (bt // T) * max_pages + slot // PAGE).to(tl.int64)
    dst = POOL + (page * PAGE + slot % PAGE) * (C + R)
    tl.store(dst + c, tl.load(LAT + bt * C + c).to(POOL.dtype.element_ty))
    tl.store(dst + C + i[None, :], (ke * cos - ko * sin).to(POOL.dtype.element_ty))
    tl.store(dst + C + R // 2 + i[None, :], (ko * cos + ke * sin).to(POOL.dtype.element_ty))


# ---------------------------------------------------------------------------------------------
# launchers


def fused_available(x: torch.Tensor) -> bool:
    """True where the fused kernels run for x: a GPU, or the CPU under the interpreter."""
    return x.device.type == "cuda" or (x.device.type == "cpu" and INTERPRETED)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """x [..., D] normalised over D in fp32, times weight [D]; x.dtype out. One launch."""
    D = x.shape[-1]
    if weight.shape != (D,):
        raise ValueError(f"weight: expected shape [{D}], got {list(weight.shape)}")
    xc = x.contiguous()
    out = torch.empty_like(xc)
    rows = xc.numel() // D if D else 0
    if rows:
        _rms_norm[(rows,)](xc, weight, out, eps, D=D, BLOCK=triton.next_power_of_2(D), num_warps=8 if D >= 4096 else 4)
    return out


def add_rms_norm(x: torch.Tensor, y: torch.Tensor, weight: torch.Tensor, eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(s, rms_norm(s, weight, eps)) for s = x + y ([..., D], x.dtype; fp32 sum, fp64 for fp64). One launch."""
    D = x.shape[-1]
    if y.shape != x.shape or y.dtype != x.dtype:
        raise ValueError(f"y: expected {x.dtype} {list(x.shape)} (as x), got {y.dtype} {list(y.shape)}")
    if weight.shape != (D,):
        raise ValueError(f"weight: expected shape [{D}], got {list(weight.shape)}")
    xc, yc = x.contiguous(), y.contiguous()
    s, out = torch.empty_like(xc), torch.empty_like(xc)
    rows = xc.numel() // D if D else 0
    if rows:
        _add_rms_norm[(rows,)](xc, yc, s, weight, out, eps, D=D, BLOCK=triton.next_power_of_2(D),
                               F64=x.dtype == torch.float64, num_warps=8 if D >= 4096 else 4)
    return s, out


def rms_norm_pair(x: torch.Tensor, wa: torch.Tensor, wb: torch.Tensor, eps_a: float, eps_b: float) -> tuple[torch.Tensor, torch.Tensor]:
    """rms_norm of x[..., :DA] by wa and of x[..., DA:DA + DB] by wb (DA, DB = their lengths), read in
    place from x [..., >= DA + DB] (last dim contiguous, rows evenly strided); two contiguous outputs
    [..., DA] and [..., DB] in x.dtype. One launch."""
    DA, DB = wa.shape[0], wb.shape[0]
    if wa.dim() != 1 or wb.dim() != 1 or x.shape[-1] < DA + DB:
        raise ValueError(f"wa/wb: expected 1-d weights of at most {x.shape[-1]} columns together, got {list(wa.shape)} and {list(wb.shape)}")
    lead = x.shape[:-1]
    rows = x[..., 0].numel()
    flat = x.reshape(rows, x.shape[-1]) if rows else x.reshape(0, x.shape[-1])
    if flat.stride(-1) != 1:
        raise ValueError(f"x: expected its last dim contiguous, got strides {x.stride()}")
    oa, ob = torch.empty(*lead, DA, dtype=x.dtype, device=x.device), torch.empty(*lead, DB, dtype=x.dtype, device=x.device)
    if rows:
        _rms_norm_pair[(rows,)](flat, wa, wb, oa, ob, flat.stride(0), eps_a, eps_b, DA=DA, DB=DB,
                                BA=triton.next_power_of_2(DA), BB=triton.next_power_of_2(DB), num_warps=4)
    return oa, ob


def moe_route(logits: torch.Tensor, bias: torch.Tensor, k: int, scale: float, draw=None) -> tuple[torch.Tensor, torch.Tensor]:
    """logits [N, n_experts] (the router GEMM's output), bias [n_experts] fp32 -> (ids [N, k] int64,
    w [N, k] fp32): the k largest sigmoid(logits) + bias, best first (ties: lowest id), and their
    sigmoid scores normalised to sum 1 times scale. draw = (log_p [n_experts] fp32, calls, salt) (0-d
    int64 device tensors): the k largest log_p + Gumbel noise of the counter hash instead (the
    uniform / skewed routing policies, kdengine.engine.moe.draw_experts; calls already advanced).
    One launch."""
    from kdengine.engine.moe import _GOLDEN, _MIX1, _MIX2

    N, n_experts = logits.shape
    if bias.shape != (n_experts,) or not 1 <= k <= n_experts:
        raise ValueError(f"bias/k: expected [{n_experts}] and 1 <= k <= {n_experts}, got {list(bias.shape)} and {k}")
    ids = torch.empty(N, k, dtype=torch.int64, device=logits.device)
    w = torch.empty(N, k, dtype=torch.float32, device=logits.device)
    log_p, calls, salt = draw if draw is not None else (bias, ids, ids)  # unread without a draw
    if N:
        _moe_route[(N,)](logits.contiguous(), bias.float().contiguous(), log_p.float().contiguous(), calls, salt, ids, w,
                         n_experts, float(scale), _GOLDEN, _MIX1, _MIX2, K=k, KP=triton.next_power_of_2(k),
                         BLOCK=triton.next_power_of_2(n_experts), DRAW=draw is not None, num_warps=4)
    return ids, w


def moe_plan(ids: torch.Tensor, lo: int, E: int, load: torch.Tensor):
    """ids [N, k] global expert ids; this rank's experts are lo..lo+E-1; load [E] fp32 (counts added).
    Returns (rows [N*k] int64: the token of each sorted slot, inv [N, k] int64: each slot's sorted
    position, offs [E] int32: end of each expert's run, valid [N, k] int8: 1 = this rank's expert).
    One launch (one program)."""
    N, k = ids.shape
    if load.shape != (E,) or load.dtype != torch.float32:
        raise ValueError(f"load: expected float32 [{E}], got {load.dtype} {list(load.shape)}")
    NK = N * k
    rows = torch.empty(NK, dtype=torch.int64, device=ids.device)
    inv = torch.empty(N, k, dtype=torch.int64, device=ids.device)
    offs = torch.empty(E, dtype=torch.int32, device=ids.device)
    valid = torch.empty(N, k, dtype=torch.int8, device=ids.device)
    if NK:
        _moe_plan[(1,)](ids.contiguous(), rows, inv, offs, valid, load, NK, lo, E, K=k,
                        BLOCK=triton.next_power_of_2(NK), num_warps=8)
    return rows, inv, offs, valid


def moe_combine(y: torch.Tensor, inv: torch.Tensor, w: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """y [NK, D] (expert outputs, one row per assignment, sorted by expert; rows of invalid slots
    may hold anything), inv [N, k] (each slot's row in y), w [N, k] routing weights, valid [N, k]
    bool -> [N, D] in y.dtype. One launch; deterministic (no atomics)."""
    N, k = inv.shape
    if w.shape != (N, k) or valid.shape != (N, k) or y.dim() != 2 or y.shape[0] < N * k:
        raise ValueError(f"w/valid/y: expected [{N}, {k}], [{N}, {k}] and [>= {N * k}, D], "
                         f"got {list(w.shape)}, {list(valid.shape)} and {list(y.shape)}")
    D = y.shape[1]
    out = torch.empty(N, D, dtype=y.dtype, device=y.device)
    if N and D:
        BLOCK = 1024
        _moe_combine[(N, triton.cdiv(D, BLOCK))](y.contiguous(), inv.contiguous(), w.float().contiguous(),
                                                 valid.to(torch.int8).contiguous(), out, D, K=k, BLOCK=BLOCK, num_warps=4)  # int8: no copy
    return out


def mla_rope_pack(q_lat, q, latent, k_pe, cos, sin, pool, page_table, slots, page_size: int) -> torch.Tensor:
    """The absorbed query [B, T, H, C + R] bf16, and the rotated KV rows written into `pool`.

    q_lat [H, B*T, C] (the absorbing bmm's output, heads first); q [B, T, H, QH] with the rope part at
    QH - R..QH; latent [B, T, C]; k_pe [B, T, R] (a view with any row stride, last dim contiguous);
    cos/sin [B, T, R] fp32; pool [P, page_size, C + R] (one layer); page_table [B, max_pages] int32;
    slots [B, T] token positions. Shapes are checked on the host; slots and pages are trusted (the
    engine reserved them before the step)."""
    B, T, H, QH = q.shape
    C = latent.shape[-1]
    R = k_pe.shape[-1]
    if q_lat.shape != (H, B * T, C) or latent.shape != (B, T, C) or k_pe.shape != (B, T, R) or QH < R:
        raise ValueError(f"q_lat/latent/k_pe: expected [H, B*T, C], [B, T, C], [B, T, R] for q {list(q.shape)}, "
                         f"got {list(q_lat.shape)}, {list(latent.shape)}, {list(k_pe.shape)}")
    if k_pe.stride(-1) != 1 or k_pe.stride(0) != T * k_pe.stride(1):
        raise ValueError(f"k_pe: expected rows of a [B, T, *] tensor (last dim contiguous), got strides {k_pe.stride()}")
    if cos.shape != (B, T, R) or sin.shape != (B, T, R):
        raise ValueError(f"cos/sin: expected [{B}, {T}, {R}], got {list(cos.shape)} and {list(sin.shape)}")
    if pool.dim() != 3 or pool.shape[1] != page_size or pool.shape[2] != C + R:
        raise ValueError(f"pool: expected [P, {page_size}, {C + R}], got {list(pool.shape)}")
    if slots.shape != (B, T) or page_table.shape[0] != B:
        raise ValueError(f"slots/page_table: expected [{B}, {T}] and [{B}, max_pages], got {list(slots.shape)} and {list(page_table.shape)}")
    q_abs = torch.empty(B, T, H, C + R, dtype=torch.bfloat16, device=q.device)
    _mla_rope_pack[(B * T,)](
        q_lat.contiguous(), q.contiguous(), latent.contiguous(), k_pe, cos.float().contiguous(), sin.float().contiguous(),
        q_abs, pool, page_table.contiguous(), slots.contiguous().long(), page_table.shape[1], T, B * T, k_pe.stride(1),
        H=H, HP=triton.next_power_of_2(H), C=C, R=R, QH=QH, NOPE=QH - R, PAGE=page_size, num_warps=4,
    )
    return q_abs


__all__ = ["add_rms_norm", "fused_available", "mla_rope_pack", "moe_combine", "moe_plan", "moe_route", "rms_norm", "rms_norm_pair"]
