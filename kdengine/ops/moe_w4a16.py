"""W4A16 grouped MoE in Triton: bf16 activations, INT4 expert weights with group-32 scales in the
compressed-tensors pack-quantized layout (kdengine.ops.int4), the routed tokens grouped by expert.

moe_w4a16(x, ids, valid, route_w, w13, s13, w2, s2) = sum over each token's local experts e of
  route_w * down_e(silu(gate_e(x)) * up_e(x)),   weights dequantized on the fly (W = q * scale).
Two launches of one kernel: gate/up fused with SiLU (writes h per sorted slot), then down with the
routing weight applied (writes one row per assignment; the k rows of a token are summed after).
Graph-capturable: assignments are sorted and padded to BLOCK_M on the device (align_assignments: no
host sync, fixed-size outputs), the grid is the worst case and unused blocks exit at once.
Design notes (read, not copied): vLLM's fused_moe (moe_align_block_size: per-expert padding to the
tile, one expert per M block, sentinel rows), its GPTQ/AWQ Triton variant (unpack nibbles in registers,
then tl.dot), Marlin (the weights are the traffic: stream each touched expert's tile once).
The weight tile is the MMA's M side (out^T = W x^T): decode has few tokens per expert, so the token
block is the narrow N side (16) and every 128-bit weight load feeds the tensor cores.

Letters: N tokens, k top-k, NK = N*k assignments, E local experts, D hidden, I intermediate,
P padded slots (NK + E*(BLOCK_M-1), rounded to BLOCK_M), G group size.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from kdengine.ops.int4 import GROUP, PACK, check_packed, dequantize_int4

BLOCK_M = 16
DEFAULT_CONFIG = {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3, "unpack": "reshape"}


# ---------------------------------------------------------------------------- kernel


@triton.jit
def _moe_w4a16_kernel(
    a_ptr, w_ptr, s_ptr, out_ptr, slots_ptr, block_expert_ptr, route_w_ptr,
    N_OUT, K, NK, NUM_BLOCKS,
    stride_am, stride_we, stride_wn, stride_se, stride_sn, stride_om,
    TOPK: tl.constexpr, GATED: tl.constexpr, GROUP: tl.constexpr, RESHAPE: tl.constexpr, DOT_F32: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
):
    """One (M block of one expert, N tile). GATED: a = x rows of the block's tokens, weights rows
    [n] (gate) and [N_OUT + n] (up), out[slot] = silu(g) * u. Else: a = h rows of the block's slots,
    out[assignment] = route_w * (a @ W^T). Accumulators are [BLOCK_N, BLOCK_M] (weights as MMA M)."""
    pid = tl.program_id(0)
    pid_m = pid % NUM_BLOCKS  # blocks of one N tile are neighbours: an expert's tile is reused from L2
    pid_n = pid // NUM_BLOCKS
    expert = tl.load(block_expert_ptr + pid_m)
    if expert < 0:
        return
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    assign = tl.load(slots_ptr + offs_m)  # assignment id (token * TOPK + slot), NK = padding
    live = assign < NK
    if GATED:
        a_rows = assign // TOPK
    else:
        a_rows = offs_m
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_ok = offs_n < N_OUT
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + a_rows[:, None] * stride_am + offs_k[None, :]
    w_rows = w_ptr + expert.to(tl.int64) * stride_we + offs_n[:, None].to(tl.int64) * stride_wn
    s_rows = s_ptr + expert.to(tl.int64) * stride_se + offs_n[:, None].to(tl.int64) * stride_sn
    up_w = N_OUT * stride_wn
    up_s = N_OUT * stride_sn
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    acc_up = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(a_ptrs + k0, mask=live[:, None], other=0.0)  # [BM, BK] bf16
        if DOT_F32:  # the Triton interpreter multiplies bf16 dot operands as raw uint16: widen them there
            a = a.to(tl.float32)
        if RESHAPE:  # one load per int32 word, nibbles split in registers
            offs_w = k0 // 8 + tl.arange(0, BLOCK_K // 8)
            offs_g = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
            w_off = offs_w[None, :]
            s_off = offs_g[None, :]
        else:  # one (cached) load per value: the word holding column k
            w_off = ((k0 + offs_k) // 8)[None, :]
            s_off = ((k0 + offs_k) // GROUP)[None, :]
        w = _dequant(tl.load(w_rows + w_off, mask=n_ok[:, None], other=0), tl.load(s_rows + s_off, mask=n_ok[:, None], other=0.0),
                     k0 + offs_k, RESHAPE, GROUP, BLOCK_N, BLOCK_K)
        if DOT_F32:
            w = w.to(tl.float32)
        acc = tl.dot(w, tl.trans(a), acc)
        if GATED:
            wu = _dequant(tl.load(w_rows + up_w + w_off, mask=n_ok[:, None], other=0), tl.load(s_rows + up_s + s_off, mask=n_ok[:, None], other=0.0),
                          k0 + offs_k, RESHAPE, GROUP, BLOCK_N, BLOCK_K)
            if DOT_F32:
                wu = wu.to(tl.float32)
            acc_up = tl.dot(wu, tl.trans(a), acc_up)
    if GATED:
        h = acc * tl.sigmoid(acc) * acc_up
        out_ptrs = out_ptr + offs_m[None, :].to(tl.int64) * stride_om + offs_n[:, None]
        tl.store(out_ptrs, h.to(out_ptr.dtype.element_ty), mask=n_ok[:, None])
    else:
        rw = tl.load(route_w_ptr + assign, mask=live, other=0.0)
        y = acc * rw[None, :]
        out_ptrs = out_ptr + assign[None, :].to(tl.int64) * stride_om + offs_n[:, None]  # padding -> row NK (scratch)
        tl.store(out_ptrs, y.to(out_ptr.dtype.element_ty), mask=n_ok[:, None])


@triton.jit
def _dequant(words, scales, k, RESHAPE: tl.constexpr, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """[BLOCK_N, BLOCK_K] bf16 weights from packed words and group scales (q - 8) * scale.
    RESHAPE: words [BN, BK/8], scales [BN, BK/G]; else words/scales already [BN, BK] per column k."""
    if RESHAPE:
        shifts = tl.arange(0, 8) * 4
        q = (words[:, :, None] >> shifts[None, None, :]) & 0xF
        q = tl.reshape(q, (BLOCK_N, BLOCK_K))
        s = tl.reshape(tl.broadcast_to(scales[:, :, None], (BLOCK_N, BLOCK_K // GROUP, GROUP)), (BLOCK_N, BLOCK_K))
    else:
        q = (words >> ((k % 8) * 4)[None, :]) & 0xF
        s = scales
    return ((q - 8).to(tl.float32) * s.to(tl.float32)).to(tl.bfloat16)


INTERPRETED = type(_moe_w4a16_kernel).__name__ == "InterpretedFunction"  # TRITON_INTERPRET=1 (CPU tests)


# ---------------------------------------------------------------------------- grouping (device side)


def padded_slots(n_assign: int, n_experts: int, block_m: int = BLOCK_M) -> int:
    """P: slots for n_assign assignments when every expert's group is padded to block_m."""
    return -(-(n_assign + n_experts * (block_m - 1)) // block_m) * block_m


def align_assignments(ids: torch.Tensor, valid: torch.Tensor, n_experts: int, block_m: int = BLOCK_M):
    """Sort assignments by local expert and pad each expert's group to block_m, on the device.
    ids/valid [N, k] (valid False = another rank's expert). Returns slots [P] int32 (assignment id
    n*k + j, or NK for padding) and block_expert [P / block_m] int32 (-1 = unused block)."""
    N, k = ids.shape
    NK, E, dev = N * k, n_experts, ids.device
    P = padded_slots(NK, E, block_m)
    key = torch.where(valid, ids.long(), torch.full_like(ids, E, dtype=torch.long)).flatten()
    counts = torch.zeros(E + 1, dtype=torch.long, device=dev).scatter_add_(0, key, torch.ones_like(key))
    padded = (counts[:E] + block_m - 1) // block_m * block_m
    ends = torch.cumsum(padded, 0)
    order = torch.sort(key, stable=True).indices
    ksorted = key[order]
    first = torch.cumsum(counts, 0) - counts  # first sorted position of each key
    rank = torch.arange(NK, device=dev) - first[ksorted]
    dest = torch.where(ksorted < E, (ends - padded)[ksorted.clamp(max=E - 1)] + rank, torch.full_like(rank, P))
    slots = torch.full((P + 1,), NK, dtype=torch.int32, device=dev).scatter_(0, dest, order.to(torch.int32))[:P]
    starts = torch.arange(0, P, block_m, device=dev)
    be = torch.searchsorted(ends, starts, right=True)
    block_expert = torch.where(be < E, be, torch.full_like(be, -1)).to(torch.int32)
    return slots, block_expert


# ---------------------------------------------------------------------------- launcher


def check_inputs(x, ids, valid, route_w, w13, s13, w2, s2, group: int) -> tuple[int, int, int]:
    """(E, D, I) after checking every argument's dtype and shape (ValueError naming it)."""
    if x.dtype != torch.bfloat16 or x.dim() != 2:
        raise ValueError(f"x: expected a 2-D bfloat16 tensor [N, D], got {x.dtype} {list(x.shape)}")
    if ids.shape != valid.shape or ids.dim() != 2 or ids.shape[0] != x.shape[0]:
        raise ValueError(f"ids/valid: expected [N={x.shape[0]}, k] each, got {list(ids.shape)} / {list(valid.shape)}")
    if route_w.shape != ids.shape:
        raise ValueError(f"route_w: expected shape {list(ids.shape)}, got {list(route_w.shape)}")
    two_i, D = check_packed(w13, s13, group)
    D2, I = check_packed(w2, s2, group)
    E = w13.shape[0]
    if w13.dim() != 3 or w2.dim() != 3 or w2.shape[0] != E:
        raise ValueError(f"w13/w2: expected [E, 2I, D/8] and [E, D, I/8], got {list(w13.shape)} / {list(w2.shape)}")
    if D != x.shape[1] or D2 != D or two_i != 2 * I:
        raise ValueError(f"w13/w2: expected [E, 2I, {x.shape[1] // PACK}] and [E, {x.shape[1]}, I/8] for D={x.shape[1]}, "
                         f"got {list(w13.shape)} / {list(w2.shape)}")
    return E, D, I


def moe_w4a16(x, ids, valid, route_w, w13, s13, w2, s2, *, group: int = GROUP, config: dict | None = None,
              poison: bool = False) -> torch.Tensor:
    """Routed-expert output [N, D] bf16 (shared expert not included).
    x [N, D] bf16; ids [N, k] local expert ids (any value where valid is False); valid [N, k] bool;
    route_w [N, k] routing weights; w13 int32 [E, 2I, D/8] (gate rows then up rows) + s13 [E, 2I, D/G];
    w2 int32 [E, D, I/8] + s2 [E, D, I/G]. poison: fill the intermediate buffers with NaN first (tests)."""
    E, D, I = check_inputs(x, ids, valid, route_w, w13, s13, w2, s2, group)
    cfg = {**DEFAULT_CONFIG, **(config or {})}
    N, k = ids.shape
    NK = N * k
    slots, block_expert = align_assignments(ids, valid, E, BLOCK_M)
    P = slots.numel()
    x = x.contiguous()
    h = torch.empty(P, I, dtype=torch.bfloat16, device=x.device)  # every row of a used block is written
    y = torch.zeros(NK + 1, D, dtype=torch.bfloat16, device=x.device)  # row NK: padding scratch
    if poison:
        h.fill_(float("nan"))
        y[NK].fill_(float("nan"))
    rw = route_w.reshape(-1).float().contiguous()
    launch(x, w13, s13, h, slots, block_expert, rw, I, D, NK, k, True, group, cfg)
    launch(h, w2, s2, y, slots, block_expert, rw, D, I, NK, k, False, group, cfg)
    return y[:NK].view(N, k, D).float().sum(1).to(torch.bfloat16)


def launch(a, w, s, out, slots, block_expert, rw, n_out: int, K: int, NK: int, k: int, gated: bool, group: int, cfg: dict):
    """One pass of the kernel over every (M block, N tile)."""
    bn = min(cfg["BLOCK_N"], triton.next_power_of_2(n_out))
    bk = cfg["BLOCK_K"]
    while K % bk:
        bk //= 2
    if bk < max(group, 16):
        raise ValueError(f"K: expected a multiple of {max(group, 16)}, got {K}")
    blocks = block_expert.numel()
    grid = (blocks * triton.cdiv(n_out, bn),)
    _moe_w4a16_kernel[grid](
        a, w, s, out, slots, block_expert, rw,
        n_out, K, NK, blocks,
        a.stride(0), w.stride(0), w.stride(1), s.stride(0), s.stride(1), out.stride(0),
        TOPK=k, GATED=gated, GROUP=group, RESHAPE=cfg["unpack"] == "reshape", DOT_F32=INTERPRETED,
        BLOCK_M=BLOCK_M, BLOCK_N=bn, BLOCK_K=bk, num_warps=cfg["num_warps"], num_stages=cfg["num_stages"],
    )


# ---------------------------------------------------------------------------- reference


def moe_reference(x, ids, valid, route_w, w13, s13, w2, s2, *, group: int = GROUP) -> torch.Tensor:
    """Dequantize-then-matmul in fp32, per assignment: the oracle. Returns [N, D] fp32."""
    E, D, I = check_inputs(x, ids, valid, route_w, w13, s13, w2, s2, group)
    xf = x.float()
    out = torch.zeros(x.shape[0], D, dtype=torch.float32, device=x.device)
    for e in range(E):
        sel = valid & (ids == e)
        if not bool(sel.any()):
            continue
        rows, slot = sel.nonzero(as_tuple=True)
        g, u = dequantize_int4(w13[e], s13[e], torch.float32, group).chunk(2, 0)
        h = torch.nn.functional.silu(xf[rows] @ g.t()) * (xf[rows] @ u.t())
        y = h @ dequantize_int4(w2[e], s2[e], torch.float32, group).t()
        out.index_add_(0, rows, y * route_w[rows, slot].float()[:, None])
    return out


# ---------------------------------------------------------------------------- benchmark hook

SWEEP = [  # the gather variant measured 20x slower than reshape on the H200 (commit a13e6ea): not swept
    {"BLOCK_N": 64, "BLOCK_K": 128, "num_warps": 4, "num_stages": 3, "unpack": "reshape"},
    {"BLOCK_N": 64, "BLOCK_K": 256, "num_warps": 4, "num_stages": 4, "unpack": "reshape"},
    {"BLOCK_N": 128, "BLOCK_K": 128, "num_warps": 8, "num_stages": 3, "unpack": "reshape"},
    {"BLOCK_N": 32, "BLOCK_K": 256, "num_warps": 4, "num_stages": 3, "unpack": "reshape"},
]


def bench(tokens: int = 64, top_k: int = 8, n_experts: int = 384, E: int = 48, D: int = 7168, I: int = 2048,
          samples: int = 30, seed: int = 0) -> dict:
    """One Kimi TP8 rank's MoE layer (48 of 384 experts, D 7168, I 2048) at `tokens` x top-k under
    uniform routing: the W4A16 kernel (a config sweep) against the bf16 grouped path (torch._grouped_mm,
    kdengine.engine.moe.experts_grouped_mm) on the same routing; CUDA-graph replays, L2 flushed
    between samples, median. Bandwidth counts the bytes of the experts touched (weights + scales)."""
    from types import SimpleNamespace

    from kdengine.bench import fingerprint, roofline, timer
    from kdengine.engine.moe import experts_grouped_mm

    dev = torch.device("cuda")
    gen = torch.Generator(device=dev).manual_seed(seed)
    ids = torch.topk(torch.rand(tokens, n_experts, generator=gen, device=dev), top_k, -1).indices  # uniform k-subsets
    valid = ids < E  # this rank holds experts [0, E)
    rw = torch.rand(tokens, top_k, generator=gen, device=dev)
    x = torch.randn(tokens, D, generator=gen, device=dev).to(torch.bfloat16)

    def int4(O, K):
        w = torch.empty(E, O, K // PACK, dtype=torch.int32, device=dev).random_(-(2**31), 2**31 - 1, generator=gen)
        return w, (torch.rand(E, O, K // GROUP, generator=gen, device=dev) * 0.01 + 0.005).to(torch.bfloat16)

    w13, s13 = int4(2 * I, D)
    w2, s2 = int4(D, I)
    touched = int(torch.unique(ids[valid]).numel())
    int4_bytes = touched * (w13[0].numel() * 4 + s13[0].numel() * 2 + w2[0].numel() * 4 + s2[0].numel() * 2)
    bf16_bytes = touched * 3 * D * I * 2
    copy_bw = roofline.ceilings(dev).copy_bytes_per_s
    out = {"tokens": tokens, "top_k": top_k, "n_experts": n_experts, "local_experts": E, "D": D, "I": I,
           "routing": "uniform", "local_assignments": int(valid.sum()), "experts_touched": touched,
           "int4_bytes": int4_bytes, "bf16_bytes": bf16_bytes, "copy_ceiling_bytes_per_s": copy_bw,
           "ceiling_note": "device copy bandwidth counted read + write (kdengine.bench.roofline)",
           "fingerprint": fingerprint.collect(), "w4a16": []}
    ref = moe_reference(x, ids, valid, rw, w13, s13, w2, s2)
    for cfg in SWEEP:
        try:
            got = moe_w4a16(x, ids, valid, rw, w13, s13, w2, s2, config=cfg)
            err = float((got.float() - ref).norm() / ref.norm())
            weights = (w13, s13, w2, s2)
            m = timer.time_gpu(lambda i, c=cfg, w=weights: moe_w4a16(x, ids, valid, rw, *w, config=c),
                               samples=samples, launches=4, l2_flush=True)
        except Exception as exc:  # a config that does not compile here is reported, not fatal
            out["w4a16"].append({"config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:300]}"})
            continue
        s = m.median
        out["w4a16"].append({"config": cfg, "rel_err_vs_fp32": err, "median_s": s, "samples_s": m.samples,
                             "method": m.method, "gbps": int4_bytes / s / 1e9, "pct_of_copy": 100 * int4_bytes / s / copy_bw})
        print(f"w4a16 {cfg}: {s * 1e6:.1f} us, {int4_bytes / s / 1e9:.0f} GB/s = {100 * int4_bytes / s / copy_bw:.1f}% of copy, err {err:.2e}", flush=True)
    del w13, s13, w2, s2
    gu = torch.randn(E, 2 * I, D, generator=gen, device=dev).to(torch.bfloat16)
    dn = torch.randn(E, D, I, generator=gen, device=dev).to(torch.bfloat16)
    moe = SimpleNamespace(cfg=SimpleNamespace(local_experts=E), dequantized=lambda e=None, dtype=None: (gu, dn))
    m = timer.time_gpu(lambda i: experts_grouped_mm(moe, x, ids, rw, valid), samples=samples, launches=4, l2_flush=True)
    out["bf16_grouped_mm"] = {"median_s": m.median, "samples_s": m.samples, "method": m.method,
                              "gbps": bf16_bytes / m.median / 1e9, "pct_of_copy": 100 * bf16_bytes / m.median / copy_bw}
    ok = [r for r in out["w4a16"] if "median_s" in r]
    if ok:
        best = min(ok, key=lambda r: r["median_s"])
        out["best"] = {**best, "speedup_vs_bf16": m.median / best["median_s"]}
    print(f"bf16 grouped_mm: {m.median * 1e6:.1f} us ({out['bf16_grouped_mm']['gbps']:.0f} GB/s); touched {touched} experts", flush=True)
    return out


if __name__ == "__main__":
    import argparse
    import json

    ap = argparse.ArgumentParser(description="W4A16 MoE microbenchmark (one Kimi TP8 rank's MoE layer)")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--samples", type=int, default=30)
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    result = bench(tokens=a.tokens, samples=a.samples)
    text = json.dumps(result, indent=1, default=str)
    if a.json:
        with open(a.json, "w") as fh:
            fh.write(text)
    print(json.dumps(result.get("best", {}), default=str))
