"""Fused per-layer glue (kdengine.engine.fused_ops) against the torch ops that define it: RMSNorm, and the
MLA rope + q_abs packing + paged KV write; then a whole bf16 forward with and without them. Run in the
Triton interpreter (child process, CPU) and compiled on a GPU. Bad shapes raise ValueError."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from kdengine.engine.config import ModelConfig
from kdengine.engine.kv_cache import PagedKVCache


def ulp_excess(got: torch.Tensor, ref: torch.Tensor) -> float:
    """max over elements of |got - ref| minus one bf16 ulp of ref (<= 0: within one rounding)."""
    got, ref = got.float(), ref.float()
    return float(((got - ref).abs() - ref.abs() * 2.0**-7 - 1e-6).max())


def check_all(device: str) -> dict[str, float]:
    """Each check's excess (<= 0 passes)."""
    from kdengine.engine import fused_ops
    from kdengine.engine.model import RMSNorm, apply_rope, rope_frequencies, rope_tables

    gen = torch.Generator().manual_seed(7)
    out = {}
    for shape in ((2, 5, 96), (3, 7168), (1, 4, 1536), (7, 33)):  # odd sizes, one row, a big row
        x = (torch.randn(*shape, generator=gen) * 3).bfloat16()
        norm = RMSNorm(shape[-1], 1e-6)
        norm.weight.data = torch.randn(shape[-1], generator=gen)
        xf = x.float()  # RMSNorm's torch formula (RMSNorm itself takes the fused path where it runs)
        ref = ((xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)) * norm.weight).to(x.dtype)
        out[f"rms{shape}"] = ulp_excess(fused_ops.rms_norm(x.to(device), norm.weight.to(device), 1e-6).cpu(), ref)
        y = (torch.randn(*shape, generator=gen) * 3).bfloat16()
        s_ref = x + y  # torch's bf16 add
        s, h = fused_ops.add_rms_norm(x.to(device), y.to(device), norm.weight.to(device), 1e-6)
        sf = s.cpu().float()  # the norm of the sum the kernel stored
        ref = ((sf * torch.rsqrt(sf.pow(2).mean(-1, keepdim=True) + 1e-6)) * norm.weight).to(x.dtype)
        out[f"add_rms_sum{shape}"] = ulp_excess(s.cpu(), s_ref)  # bit-equal on a GPU; the interpreter truncates
        out[f"add_rms{shape}"] = ulp_excess(h.cpu(), ref)
    qkv = (torch.randn(3, 5, 96 + 40 + 16, generator=gen) * 2).bfloat16()  # [.., DA + DB + rest], read in place
    wa, wb = torch.randn(96, generator=gen), torch.randn(40, generator=gen)
    ga, gb = fused_ops.rms_norm_pair(qkv.to(device), wa.to(device), wb.to(device), 1e-6, 1e-5)
    for got, part, w, eps, name in ((ga, qkv[..., :96], wa, 1e-6, "pair_a"), (gb, qkv[..., 96:136], wb, 1e-5, "pair_b")):
        pf = part.float()
        out[name] = ulp_excess(got.cpu(), ((pf * torch.rsqrt(pf.pow(2).mean(-1, keepdim=True) + eps)) * w).to(part.dtype))
    N, k, D = 6, 3, 1100  # MoE combine: rows sorted by expert, invalid slots' rows poisoned
    valid = torch.rand(N, k, generator=gen) < 0.7
    w = torch.rand(N, k, generator=gen)
    order = torch.randperm(N * k, generator=gen)  # sorted position -> assignment
    inv = torch.empty_like(order).scatter_(0, order, torch.arange(N * k)).view(N, k)
    y = torch.randn(N * k + 2, D, generator=gen).bfloat16()
    y[inv[~valid]] = float("nan")
    ref = (y[inv].float() * (w * valid)[..., None]).nan_to_num(0.0).sum(1).bfloat16()
    got = fused_ops.moe_combine(y.to(device), inv.to(device), w.to(device), valid.to(device)).cpu()
    out["moe_combine"] = ulp_excess(got, ref) if not got.isnan().any() else float("inf")
    from kdengine.engine.moe import hash_uniform, sort_assignments

    for N, k, n_exp, lo, E in ((64, 8, 384, 48, 48), (5, 2, 8, 4, 4)):  # router top-k and the grouped GEMM plan
        logits, bias = torch.randn(N, n_exp, generator=gen), torch.randn(n_exp, generator=gen) * 0.1
        ids, w = fused_ops.moe_route(logits.to(device), bias.to(device), k, 2.5)
        score = torch.sigmoid(logits)
        ref_ids = torch.topk(score + bias, k, dim=-1).indices
        ref_w = score.gather(1, ref_ids)
        out[f"route_ids{N}"] = 0.0 if torch.equal(ids.cpu(), ref_ids) else float("inf")
        out[f"route_w{N}"] = float((w.cpu() - ref_w / ref_w.sum(-1, keepdim=True) * 2.5).abs().max()) - 1e-6
        log_p, calls, salt = torch.randn(n_exp, generator=gen), torch.tensor(7), torch.tensor(3)  # a policy's draw
        d_ids, d_w = fused_ops.moe_route(logits.to(device), bias.to(device), k, 1.0, (log_p.to(device), calls.to(device), salt.to(device)))
        d_ref = torch.topk(log_p - torch.log(-torch.log(hash_uniform(calls, salt, N, n_exp))), k, dim=-1).indices
        out[f"draw_ids{N}"] = 0.0 if torch.equal(d_ids.cpu(), d_ref) else float("inf")
        d_rw = score.gather(1, d_ref)
        out[f"draw_w{N}"] = float((d_w.cpu() - d_rw / d_rw.sum(-1, keepdim=True)).abs().max()) - 1e-6
        load = torch.zeros(E, device=device)
        rows, inv, offs, valid = fused_ops.moe_plan(ids, lo, E, load)
        local = ref_ids - lo
        ok = (local >= 0) & (local < E)
        order, _, ref_offs = sort_assignments(local, ok, E)
        same = (torch.equal(rows.cpu(), order // k) and torch.equal(offs.cpu(), ref_offs) and torch.equal(valid.cpu().bool(), ok)
                and torch.equal(inv.cpu().flatten()[order], torch.arange(N * k))
                and torch.equal(load.cpu(), torch.bincount(local[ok], minlength=E).float()))
        out[f"plan{N}"] = 0.0 if same else float("inf")
    out["moe_planned"] = moe_planned_excess(device)
    cfg = ModelConfig.from_name("kimi-k2-tp8-rank")
    B, T, H, QH = 2, 5, 8, 192
    q = torch.randn(B, T, H, QH, generator=gen).bfloat16()
    q_lat = torch.randn(H, B * T, 512, generator=gen).bfloat16()
    qkv = torch.randn(B, T, 1536 + 576, generator=gen).bfloat16()
    latent, k_pe = torch.randn(B, T, 512, generator=gen).bfloat16(), qkv[..., 1536 + 512 :]
    pos = torch.randint(0, 70000, (B, T), generator=gen)
    inv = rope_frequencies(cfg, "cpu")
    cos, sin = rope_tables(pos, inv)
    slots = torch.tensor([[3, 64, 65, 130, 7], [0, 1, 2, 199, 100]])
    caches = []
    for _ in range(2):
        c = PagedKVCache(1, 9, 64, B, 4, "cpu")
        c.pool.fill_(-3.0)  # poison: rows not written must keep it
        for b in range(B):
            c.ensure_capacity(b, 200)
        caches.append(c)
    fused, ref = caches
    pool = fused.pool[0].to(device)
    q_abs = fused_ops.mla_rope_pack(q_lat.to(device), q.to(device), latent.to(device), k_pe.to(device), cos.to(device),
                                    sin.to(device), pool, fused.page_table.to(device), slots.to(device), 64)
    ref_q = torch.cat([q_lat.transpose(0, 1).reshape(B, T, H, 512), apply_rope(q[..., 128:], pos, inv)], -1)
    ref.write(0, torch.cat([latent, apply_rope(k_pe, pos, inv)], -1), slots)
    out["q_abs"] = ulp_excess(q_abs.cpu(), ref_q)
    out["kv_pool"] = ulp_excess(pool.cpu(), ref.pool[0])
    return out


def moe_planned_excess(device: str) -> float:
    """A tiny bf16 MoE layer through the fused plan + grouped GEMMs + fused combine vs the loop path
    (exact groups): within a bf16 ulp of the output's scale; the expert loads equal."""
    from kdengine.engine.kv_cache import PagedKVCache
    from kdengine.engine.model import Step, Transformer
    from kdengine.engine.weights import materialize

    cfg = ModelConfig.from_name("tiny", dtype="bfloat16", n_layers=2)
    moe = materialize(Transformer, cfg, device, 3).layers[1].mlp
    x = torch.randn(2, 9, cfg.hidden, generator=torch.Generator().manual_seed(0)).bfloat16().to(device)
    cache = PagedKVCache(cfg.n_layers, 4, 64, 2, 2, device)
    outs = []
    for impl in ("loop", "grouped_mm"):
        moe.impl = impl
        step = Step(cfg, cache, torch.zeros(2, 9, 1, dtype=torch.int32, device=device), "reference")
        outs.append((moe(x, step).float().cpu(), step.expert_load.cpu()))
    (ref, ref_load), (got, load) = outs
    if not torch.equal(ref_load, load):
        return float("inf")
    return float((got - ref).abs().max() / ref.abs().max()) - 2.0**-7


def forward_excess(device: str) -> float:
    """A tiny bf16 target forward with the fused glue vs without: features within a few bf16 ulps.
    Every token takes every expert (top_k = n_experts): a one-ulp difference may otherwise flip a
    top-k routing choice and move a feature by a whole expert's output (the interpreter rounds
    bf16 by truncation, the GPU to nearest even), which says nothing about the glue."""
    from kdengine.engine import fused_ops
    from kdengine.engine.step import chain_bits, forward, setup_engine

    cfg = ModelConfig.from_name("tiny", dtype="bfloat16")
    cfg = ModelConfig.from_name("tiny", dtype="bfloat16", top_k=cfg.n_experts)
    outs = []
    for fused in (True, False):
        engine = setup_engine(cfg, device, 2, 256, backend="reference" if device == "cpu" else "triton", seed=3)
        engine.cache.ensure_capacity(0, 40), engine.cache.ensure_capacity(1, 40)
        tokens = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1)).to(device)
        positions = torch.arange(9, device=device).expand(2, 9)
        saved = fused_ops.fused_available
        fused_ops.fused_available = saved if fused else (lambda x: False)
        try:
            _, feats, _ = forward(engine, tokens, positions, chain_bits(2, 9, device))
        finally:
            fused_ops.fused_available = saved
        outs.append((feats.float().cpu(), engine.cache.pool.float().cpu()))
    (f1, p1), (f0, p0) = outs
    scale = f0.abs().max()
    return float(max((f1 - f0).abs().max() / scale - 0.05, (p1 - p0).abs().max() / p0.abs().max() - 0.05))


def test_fused_ops_equal_torch_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    code = ("from tests.engine.test_fused_ops import check_all, forward_excess; r = check_all('cpu'); "
            "r['forward'] = forward_excess('cpu'); print('RESULT', max(r.values()), r)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = proc.stdout.split("RESULT")[1]
    assert float(line.split()[0]) <= 0, line


def test_bad_shapes_raise():
    from kdengine.engine import fused_ops

    with pytest.raises(ValueError, match="weight"):
        fused_ops.rms_norm(torch.zeros(2, 8), torch.ones(7), 1e-6)
    with pytest.raises(ValueError, match="y"):
        fused_ops.add_rms_norm(torch.zeros(2, 8), torch.zeros(2, 7), torch.ones(8), 1e-6)
    with pytest.raises(ValueError, match="w/valid/y"):
        fused_ops.moe_combine(torch.zeros(5, 8), torch.zeros(2, 3, dtype=torch.int64), torch.zeros(2, 3), torch.ones(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="wa/wb"):
        fused_ops.rms_norm_pair(torch.zeros(2, 8), torch.ones(6), torch.ones(3), 1e-6, 1e-6)
    B, T, H = 1, 2, 2
    q, q_lat = torch.zeros(B, T, H, 192), torch.zeros(H, B * T, 512)
    lat, k_pe, cs = torch.zeros(B, T, 512), torch.zeros(B, T, 64), torch.zeros(B, T, 64)
    pool, pages, slots = torch.zeros(4, 64, 576), torch.zeros(B, 2, dtype=torch.int32), torch.zeros(B, T, dtype=torch.int64)
    with pytest.raises(ValueError, match="q_lat"):
        fused_ops.mla_rope_pack(q_lat[:1], q, lat, k_pe, cs, cs, pool, pages, slots, 64)
    with pytest.raises(ValueError, match="cos/sin"):
        fused_ops.mla_rope_pack(q_lat, q, lat, k_pe, cs[:, :1], cs, pool, pages, slots, 64)
    with pytest.raises(ValueError, match="pool"):
        fused_ops.mla_rope_pack(q_lat, q, lat, k_pe, cs, cs, pool[:, :32], pages, slots, 64)
    with pytest.raises(ValueError, match="slots"):
        fused_ops.mla_rope_pack(q_lat, q, lat, k_pe, cs, cs, pool, pages, slots[:, :1], 64)


@pytest.mark.gpu
def test_fused_ops_equal_torch_on_the_gpu():
    r = check_all("cuda")
    r["forward"] = forward_excess("cuda")
    assert max(r.values()) <= 0, r
