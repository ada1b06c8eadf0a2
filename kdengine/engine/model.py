"""The target model: DeepseekV3/Kimi-K2 blocks (MLA attention in absorbed form + MoE), one
tensor-parallel rank. forward() runs T tokens per sequence against the paged latent KV cache through
kdengine.ops.verify_attention and returns greedy tokens, the hidden features the drafter reads, and
the MoE expert load. Parameter names follow the HF checkpoint (weights.py maps them one to one).

Letters: B batch, T tokens this call, H heads on this rank, D hidden, C = 512 latent, R = 64 rope,
E local experts, I intermediate, V local vocab. TP all-reduce points are marked `# TP:`; they run
only when a process group is given.
"""

from __future__ import annotations

import contextlib
import math

import torch
import torch.nn.functional as F
from torch import nn

from kdengine.engine.config import ModelConfig, expert_range, vocab_range
from kdengine.engine.profiler import COMM
from kdengine.ops import verify_attention

C, R = 512, 64


def torch_dtype(name: str) -> torch.dtype:
    return {"bfloat16": torch.bfloat16, "float32": torch.float32, "float64": torch.float64}[name]


def all_reduce(x: torch.Tensor, group, timer=None) -> torch.Tensor:
    """Sum over the tensor-parallel group (no-op without one), timed as COMM by `timer`."""
    if group is not None:
        with (timer or null_timer)(COMM):
            torch.distributed.all_reduce(x, group=group)
    return x


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


# ---------------------------------------------------------------------------- rope (YaRN)


def yarn_inv_freq(cfg: ModelConfig) -> torch.Tensor:
    """DeepseekV3 YaRN inverse frequencies for the 64 rope dims ([R/2] fp32, on the CPU)."""
    dim, base = R, cfg.rope_theta
    extra = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    if cfg.rope_factor <= 1:
        return extra.float()
    inter = extra / cfg.rope_factor

    def correction_dim(rot):
        return dim * math.log(cfg.rope_original_max / (rot * 2 * math.pi)) / (2 * math.log(base))

    low = max(math.floor(correction_dim(cfg.beta_fast)), 0)
    high = min(math.ceil(correction_dim(cfg.beta_slow)), dim - 1)
    high = high + 0.001 if low == high else high
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    keep = 1 - ramp
    return (inter * (1 - keep) + extra * keep).float()


_ROPE_CACHE: dict = {}


def rope_frequencies(cfg: ModelConfig, device) -> torch.Tensor:
    """yarn_inv_freq on `device`, cached (so a CUDA graph capture never copies from the host)."""
    key = (cfg.rope_theta, cfg.rope_factor, cfg.rope_original_max, cfg.beta_fast, cfg.beta_slow, str(device))
    if key not in _ROPE_CACHE:
        _ROPE_CACHE[key] = yarn_inv_freq(cfg).to(device)
    return _ROPE_CACHE[key]


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor) -> torch.Tensor:
    """HF DeepseekV3 rope: de-interleave pairs, then rotate-half. x [B, T, (H,) R], positions [B, T]."""
    freqs = positions.float()[..., None] * inv_freq  # [B, T, R/2]
    emb = torch.cat([freqs, freqs], -1)
    cos, sin = emb.cos(), emb.sin()
    if x.dim() == 4:
        cos, sin = cos[:, :, None], sin[:, :, None]
    shape = x.shape
    xf = x.float().reshape(*shape[:-1], R // 2, 2).transpose(-1, -2).reshape(shape)
    rot = torch.cat([-xf[..., R // 2 :], xf[..., : R // 2]], -1)
    return (xf * cos + rot * sin).to(x.dtype)


# ---------------------------------------------------------------------------- attention


class MLA(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        H = cfg.local_heads
        self.cfg = cfg
        self.q_a_proj = nn.Linear(cfg.hidden, cfg.q_lora_rank, bias=False)
        self.q_a_layernorm = RMSNorm(cfg.q_lora_rank, cfg.rms_eps)
        self.q_b_proj = nn.Linear(cfg.q_lora_rank, H * cfg.q_head, bias=False)
        self.kv_a_proj_with_mqa = nn.Linear(cfg.hidden, C + R, bias=False)
        self.kv_a_layernorm = RMSNorm(C, cfg.rms_eps)
        self.kv_b_proj = nn.Linear(C, H * (cfg.qk_nope + cfg.v_head), bias=False)
        self.o_proj = nn.Linear(H * cfg.v_head, cfg.hidden, bias=False)

    def absorbed(self):
        """W_UK [H, nope, C] and W_UV [H, v, C] views of kv_b_proj."""
        cfg = self.cfg
        w = self.kv_b_proj.weight.view(cfg.local_heads, cfg.qk_nope + cfg.v_head, C)
        return w[:, : cfg.qk_nope], w[:, cfg.qk_nope :]

    def forward(self, x, positions, step, layer: int, timer):
        cfg, (B, T, _) = self.cfg, x.shape
        q = self.q_b_proj(self.q_a_layernorm(self.q_a_proj(x))).view(B, T, cfg.local_heads, cfg.q_head)
        q_nope, q_pe = q[..., : cfg.qk_nope], q[..., cfg.qk_nope :]
        kv = self.kv_a_proj_with_mqa(x)  # [B, T, C + R]
        latent = self.kv_a_layernorm(kv[..., :C])
        k_pe = apply_rope(kv[..., C:], positions, step.inv_freq)
        step.cache.write(layer, torch.cat([latent, k_pe], -1).to(torch.bfloat16), step.slots)
        w_uk, w_uv = self.absorbed()
        q_lat = torch.einsum("bthn,hnc->bthc", q_nope, w_uk)  # [B, T, H, C]
        q_abs = torch.cat([q_lat, apply_rope(q_pe, positions, step.inv_freq)], -1).to(torch.bfloat16)
        with timer("verify-attention"):
            o_lat = verify_attention(
                q_abs, step.cache.pool[layer], step.cache.page_table, step.cache.lengths, step.mask_bits,
                sm_scale=cfg.sm_scale, backend=step.backend,
                check_values=layer == 0,  # one step's lengths, pages and mask serve every layer
            )  # [B, T, H, C]
        o = torch.einsum("bthc,hvc->bthv", o_lat.to(x.dtype), w_uv).reshape(B, T, -1)
        return all_reduce(self.o_proj(o), step.group, timer)  # TP: heads


# ---------------------------------------------------------------------------- MLP and MoE


class DenseMLP(nn.Module):
    def __init__(self, hidden: int, inter: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden, inter, bias=False)
        self.up_proj = nn.Linear(hidden, inter, bias=False)
        self.down_proj = nn.Linear(inter, hidden, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(cfg.n_experts, cfg.hidden))
        self.e_score_correction_bias = nn.Parameter(torch.zeros(cfg.n_experts))


def route(x, router: Router, cfg: ModelConfig):
    """noaux_tc routing (one group): sigmoid scores, top-k on score + bias, normalized weights.
    x [N, D] -> ids [N, k] (global expert ids), weights [N, k] fp32."""
    scores = torch.sigmoid(F.linear(x.float(), router.weight.float()))  # [N, E_total]
    ids = torch.topk(scores + router.e_score_correction_bias.float(), cfg.top_k, dim=-1).indices
    w = scores.gather(1, ids)
    return ids, w / w.sum(-1, keepdim=True) * cfg.routed_scaling


class MoE(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        E, I = cfg.local_experts, cfg.moe_intermediate
        self.cfg = cfg
        self.gate = Router(cfg)
        self.experts_gate_up = nn.Parameter(torch.empty(E, 2 * I, cfg.hidden))  # [E, 2I, D]
        self.experts_down = nn.Parameter(torch.empty(E, cfg.hidden, I))  # [E, D, I]
        self.shared_experts = DenseMLP(cfg.hidden, cfg.local_shared_intermediate)
        self.impl = "loop"  # loop (eager, exact groups) | grouped_mm | dense (both graph-safe)

    def forward(self, x, step, timer=None):
        B, T, D = x.shape
        flat = x.reshape(-1, D)
        ids, w = route(flat, self.gate, self.cfg)
        lo, _ = expert_range(self.cfg)
        local = ids - lo  # [N, k]; outside [0, E) = another rank's expert
        valid = (local >= 0) & (local < self.cfg.local_experts)
        step.count_experts(local, valid)
        out = EXPERT_IMPLS[self.impl](self, flat, local, w, valid)
        out = out + self.shared_experts(flat)
        return all_reduce(out.view(B, T, D), step.group, timer)  # TP: experts and shared expert


def swiglu(h: torch.Tensor) -> torch.Tensor:
    g, u = h.chunk(2, dim=-1)
    return F.silu(g) * u


def experts_loop(moe: MoE, x, local, w, valid):
    """Eager grouped compute: one matmul pair per active expert (reads counts on the host)."""
    out = torch.zeros_like(x, dtype=torch.float32)
    rows, slots = valid.nonzero(as_tuple=True)
    experts = local[rows, slots]
    for e in experts.unique().tolist():
        sel = experts == e
        r = rows[sel]
        h = swiglu(x[r] @ moe.experts_gate_up[e].t()) @ moe.experts_down[e].t()
        out.index_put_((r,), h.float() * w[r, slots[sel]][:, None], accumulate=True)
    return out.to(x.dtype)


def sort_assignments(local, valid, E: int):
    """Assignments sorted by local expert (other ranks' experts last): order [N*k], offs [E] int32."""
    key = torch.where(valid, local, torch.full_like(local, E)).flatten()
    order = torch.sort(key, stable=True).indices
    counts = torch.zeros(E + 1, dtype=torch.int32, device=local.device).scatter_add_(
        0, key, torch.ones_like(key, dtype=torch.int32)
    )
    return order, key[order], torch.cumsum(counts[:E], 0, dtype=torch.int32)


def experts_grouped_mm(moe: MoE, x, local, w, valid):
    """Graph-safe grouped GEMM (torch._grouped_mm) over assignments sorted by expert."""
    E, k = moe.cfg.local_experts, local.shape[1]
    order, key, offs = sort_assignments(local, valid, E)
    rows = order // k
    a = x[rows]  # [N*k, D]
    h = swiglu(torch._grouped_mm(a, moe.experts_gate_up.transpose(1, 2), offs=offs))
    y = torch._grouped_mm(h, moe.experts_down.transpose(1, 2), offs=offs)  # [N*k, D]
    scale = w.flatten()[order].float()
    y = torch.where((key < E)[:, None], y.float() * scale[:, None], torch.zeros((), device=x.device))
    # Un-sort with a permutation (unique indices) and sum each token's k rows: deterministic, no atomics.
    unsorted = torch.empty_like(y).index_copy_(0, order, y)
    return unsorted.view(-1, k, y.shape[-1]).sum(1).to(x.dtype)


def experts_dense(moe: MoE, x, local, w, valid):
    """Graph-safe fallback: every local expert on every token, weighted by the routing (reads all
    E experts' weights; use only where grouped_mm is unavailable)."""
    E = moe.cfg.local_experts
    slot = torch.where(valid, local, E)  # [N, k]; E collects other ranks' experts
    gates = torch.zeros(x.shape[0], E + 1, device=x.device).scatter_add_(1, slot, w.float())[:, :E]  # [N, E]
    h = swiglu(torch.einsum("nd,efd->enf", x, moe.experts_gate_up))
    y = torch.einsum("enf,edf->end", h, moe.experts_down)
    return torch.einsum("end,ne->nd", y.float(), gates).to(x.dtype)


EXPERT_IMPLS = {"loop": experts_loop, "grouped_mm": experts_grouped_mm, "dense": experts_dense}


# ---------------------------------------------------------------------------- blocks and model


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.self_attn = MLA(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mlp = MoE(cfg) if cfg.is_moe(layer) else DenseMLP(cfg.hidden, cfg.local_intermediate)

    def forward(self, x, positions, step, timer):
        x = x + self.self_attn(self.input_layernorm(x), positions, step, self.layer, timer)
        h = self.post_attention_layernorm(x)
        if isinstance(self.mlp, MoE):
            with timer("verify-moe"):
                return x + self.mlp(h, step, timer)
        return x + all_reduce(self.mlp(h), step.group, timer)  # TP: dense MLP


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        self.embed_tokens = nn.Parameter(torch.empty(cfg.local_vocab, cfg.hidden))
        self.layers = nn.ModuleList(Block(cfg, i) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.hidden, cfg.local_vocab, bias=False)

    def set_expert_impl(self, impl: str) -> None:
        if impl not in EXPERT_IMPLS:
            raise ValueError(f"impl: expected one of {sorted(EXPERT_IMPLS)}, got {impl!r}")
        for m in self.modules():
            if isinstance(m, MoE):
                m.impl = impl

    def embed(self, tokens, group, timer=None):
        """Vocab-parallel embedding: ids outside this rank's shard give zeros. tokens [B, T]."""
        lo, hi = vocab_range(self.cfg)
        inside = (tokens >= lo) & (tokens < hi)
        x = F.embedding((tokens - lo).clamp(0, hi - lo - 1), self.embed_tokens) * inside[..., None]
        return all_reduce(x, group, timer)  # TP: vocab

    def forward(self, tokens, positions, step, timer=None):
        """tokens/positions [B, T] -> greedy tokens [B, T] int64, features [B, T, F]."""
        timer = timer or null_timer
        x = self.embed(tokens, step.group, timer)
        feats = []
        for blk in self.layers:
            x = blk(x, positions, step, timer)
            if blk.layer in self.cfg.feature_layers:
                feats.append(x)
        logits = self.lm_head(self.norm(x)).float()  # [B, T, V]
        return greedy_tokens(logits, self.cfg, step.group, timer), torch.cat(feats, -1)


def greedy_tokens(logits, cfg: ModelConfig, group, timer=None) -> torch.Tensor:
    """Argmax over the whole vocab; with a group, the shards' maxima are all-gathered (TP: vocab)."""
    best, idx = logits.max(-1)
    idx = idx + vocab_range(cfg)[0]
    if group is None:
        return idx
    size = torch.distributed.get_world_size(group)
    bests, idxs = [torch.empty_like(best) for _ in range(size)], [torch.empty_like(idx) for _ in range(size)]
    with (timer or null_timer)(COMM):
        torch.distributed.all_gather(bests, best, group=group)
        torch.distributed.all_gather(idxs, idx, group=group)
    pick = torch.stack(bests).argmax(0)  # first rank wins ties = lowest token id
    return torch.stack(idxs).gather(0, pick[None])[0]


@contextlib.contextmanager
def _null(_name):
    yield


def null_timer(name):
    return _null(name)


# ---------------------------------------------------------------------------- per-call inputs


class Step:
    """What one forward needs besides tokens: the cache (lengths on the device), the KV slots the T
    tokens write, the packed tree mask, the backend, the TP group and the expert-load counter."""

    def __init__(self, cfg: ModelConfig, cache, mask_bits, backend: str, group=None):
        T = mask_bits.shape[1]
        self.cfg, self.cache, self.mask_bits, self.backend, self.group = cfg, cache, mask_bits, backend, group
        self.inv_freq = rope_frequencies(cfg, cache.pool.device)
        self.slots = cache.lengths[:, None].long() + torch.arange(T, device=cache.pool.device)  # [B, T]
        self.expert_load = torch.zeros(cfg.local_experts, dtype=torch.float32, device=cache.pool.device)

    def count_experts(self, local, valid) -> None:
        E = self.cfg.local_experts
        key = torch.where(valid, local, torch.full_like(local, E)).flatten()
        counts = torch.zeros(E + 1, dtype=torch.float32, device=local.device)
        counts.scatter_add_(0, key, torch.ones_like(key, dtype=torch.float32))
        self.expert_load += counts[:E]
