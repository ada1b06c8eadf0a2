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

from kdengine.engine import fused_ops
from kdengine.engine.config import ModelConfig, vocab_range
from kdengine.engine.moe import EXPERT_IMPLS, DenseMLP, MoE  # MLP, experts and routing live in moe.py
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
        if fused_ops.fused_available(x):  # one launch instead of ~8
            return fused_ops.rms_norm(x, self.weight, self.eps)
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight.float()).to(x.dtype)


def add_rms_norm(x, delta, norm: RMSNorm):
    """The residual stream x + delta (x itself when delta is None) and its norm, in one launch where
    the fused kernels run: the add of the block before, fused into the norm of the block after."""
    if delta is None:
        return x, norm(x)
    if fused_ops.fused_available(x):
        return fused_ops.add_rms_norm(x, delta, norm.weight, norm.eps)
    x = x + delta
    return x, norm(x)


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


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [B, T, R] fp32 for positions [B, T] (once per forward: every layer shares them)."""
    freqs = positions.float()[..., None] * inv_freq  # [B, T, R/2]
    emb = torch.cat([freqs, freqs], -1)
    return emb.cos(), emb.sin()


def apply_rope(x: torch.Tensor, positions: torch.Tensor, inv_freq: torch.Tensor, tables=None) -> torch.Tensor:
    """HF DeepseekV3 rope: de-interleave pairs, then rotate-half. x [B, T, (H,) R], positions [B, T];
    tables: rope_tables(positions, inv_freq) when the caller already has them."""
    cos, sin = tables if tables is not None else rope_tables(positions, inv_freq)
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

    def down_weight(self) -> torch.Tensor:
        """[q_lora + C + R, D]: q_a_proj and kv_a_proj_with_mqa stacked, so both down-projections are
        one GEMM. Rebuilt when either weight changes (a load bumps its version), so it is built
        before a graph capture (warm-up runs) and only read inside it."""
        wq, wkv = self.q_a_proj.weight, self.kv_a_proj_with_mqa.weight
        key = (wq.data_ptr(), wq._version, wkv.data_ptr(), wkv._version)
        if getattr(self, "_down_key", None) != key:
            self._down = torch.cat([wq.detach(), wkv.detach()], 0)
            self._down_key = key
        return self._down

    def forward(self, x, positions, step, layer: int, timer):
        cfg, (B, T, _) = self.cfg, x.shape
        H = cfg.local_heads
        with timer("qkv-down-proj"):
            qkv = F.linear(x, self.down_weight())  # [B, T, q_lora + C + R]
        q_a, latent, k_pe = qkv.split([cfg.q_lora_rank, C, R], -1)
        with timer("q/kv-norm"):
            if fused_ops.fused_available(x):  # both norms in one launch, read in place from qkv
                qn, kvn = self.q_a_layernorm, self.kv_a_layernorm
                q_a, latent = fused_ops.rms_norm_pair(qkv, qn.weight, kvn.weight, qn.eps, kvn.eps)
            else:
                q_a, latent = self.q_a_layernorm(q_a), self.kv_a_layernorm(latent)
        with timer("q-up-proj"):
            q = self.q_b_proj(q_a).view(B, T, H, cfg.q_head)
        q_nope, q_pe = q.split([cfg.qk_nope, R], -1)
        w_uk, w_uv = self.absorbed()
        with timer("absorb-q"):  # one batched GEMM over heads: [H, B*T, nope] @ [H, nope, C]
            q_lat = torch.bmm(q_nope.reshape(B * T, H, -1).transpose(0, 1), w_uk)  # [H, B*T, C]
        cache = step.cache
        if fused_ops.fused_available(x) and cache.pool.dtype == torch.bfloat16:
            with timer("rope"):  # one kernel: rope of q and k, q_abs packed, the KV row written into its page
                q_abs = fused_ops.mla_rope_pack(q_lat, q, latent, k_pe, *step.rope(positions), cache.pool[layer],
                                                cache.page_table, step.slots, cache.page_size)
        else:
            with timer("rope"):  # q and k rotated together: the key is one more "head"
                pe = apply_rope(torch.cat([q_pe, k_pe[:, :, None]], 2), positions, step.inv_freq, step.rope(positions))
            with timer("kv-write"):
                cache.write(layer, torch.cat([latent, pe[:, :, H]], -1).to(torch.bfloat16), step.slots)
            q_abs = torch.cat([q_lat.transpose(0, 1).reshape(B, T, H, C), pe[:, :, :H]], -1).to(torch.bfloat16)
        with timer("verify-attention"):
            o_lat = verify_attention(
                q_abs, step.cache.pool[layer], step.cache.page_table, step.cache.lengths, step.mask_bits,
                sm_scale=cfg.sm_scale, backend=step.backend,
                check_values=layer == 0,  # one step's lengths, pages and mask serve every layer
            )  # [B, T, H, C]
        with timer("absorb-o"):  # [H, B*T, C] @ [H, C, v]
            o = torch.bmm(o_lat.to(x.dtype).reshape(B * T, H, C).transpose(0, 1), w_uv.transpose(1, 2))
            o = o.transpose(0, 1).reshape(B, T, -1)
        with timer("o-proj"):
            o = self.o_proj(o)
        return all_reduce(o, step.group, timer)  # TP: heads


# ---------------------------------------------------------------------------- blocks and model


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.input_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.self_attn = MLA(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden, cfg.rms_eps)
        self.mlp = MoE(cfg) if cfg.is_moe(layer) else DenseMLP(cfg.hidden, cfg.local_intermediate)

    def forward(self, x, delta, positions, step, timer):
        """The residual stream enters as x + delta (delta None: x) and leaves as the returned
        (x, delta): each residual add is fused into the norm that follows it (add_rms_norm)."""
        with timer("attn-norm"):
            x, h = add_rms_norm(x, delta, self.input_layernorm)
        a = self.self_attn(h, positions, step, self.layer, timer)
        with timer("post-norm"):
            x, h = add_rms_norm(x, a, self.post_attention_layernorm)
        if isinstance(self.mlp, MoE):
            with timer("verify-moe"):
                return x, all_reduce(self.mlp(h, step, timer), step.group, timer)  # TP: experts and shared expert
        with timer("dense-mlp"):
            h = self.mlp(h)
        return x, all_reduce(h, step.group, timer)  # TP: dense MLP


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
        with timer("embed"):
            x = self.embed(tokens, step.group, timer)
        feats, delta = [], None
        for blk in self.layers:
            x, delta = blk(x, delta, positions, step, timer)
            if blk.layer in self.cfg.feature_layers:  # the drafter reads the residual stream itself
                x, delta = x + delta, None
                feats.append(x)
        with timer("lm-head"):
            logits = self.lm_head(add_rms_norm(x, delta, self.norm)[1]).float()  # [B, T, V]
        return greedy_tokens(logits, self.cfg, step.group, timer), torch.cat(feats, -1)


def greedy_tokens(logits, cfg: ModelConfig, group, timer=None) -> torch.Tensor:
    """Argmax over the whole vocab; with a group, every shard's (max, argmax) pair is all-gathered in
    one collective (TP: vocab): both packed in float64, exact for fp32 maxima and ids below 2**53."""
    best, idx = logits.max(-1)
    idx = idx + vocab_range(cfg)[0]
    if group is None:
        return idx
    size = torch.distributed.get_world_size(group)
    mine = torch.stack([best.double(), idx.double()])  # [2, B, T]
    every = torch.empty((size * 2, *mine.shape[1:]), dtype=mine.dtype, device=mine.device)
    with (timer or null_timer)(COMM):
        torch.distributed.all_gather_into_tensor(every, mine, group=group)
    every = every.view(size, 2, *mine.shape[1:])  # [ranks, 2, B, T]
    pick = every[:, 0].argmax(0)  # first rank wins ties = lowest token id
    return every[:, 1].gather(0, pick[None])[0].long()


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
        self._rope: tuple | None = None  # (positions, (cos, sin)): every layer of a forward shares them
        self.slots = cache.lengths[:, None].long() + torch.arange(T, device=cache.pool.device)  # [B, T]
        n_moe = max(cfg.n_layers - cfg.first_dense, 1)
        self.expert_load = torch.zeros(n_moe, cfg.local_experts, dtype=torch.float32, device=cache.pool.device)  # [L, E]
        self.moe_calls = 0

    def rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """rope_tables(positions) computed by the first layer that asks, reused by the others."""
        if self._rope is None or self._rope[0] is not positions:
            self._rope = (positions, rope_tables(positions, self.inv_freq))
        return self._rope[1]

    def next_load_row(self) -> torch.Tensor:
        """This MoE layer's row of expert_load [E] (a fused kernel adds its counts there)."""
        row = self.expert_load[self.moe_calls]
        self.moe_calls += 1
        return row

    def count_experts(self, local, valid) -> None:
        """Tokens routed to each local expert by this MoE layer (row moe_calls of expert_load)."""
        E = self.cfg.local_experts
        key = torch.where(valid, local, torch.full_like(local, E)).flatten()
        counts = torch.zeros(E + 1, dtype=torch.float32, device=local.device)
        counts.scatter_add_(0, key, torch.ones_like(key, dtype=torch.float32))
        self.expert_load[self.moe_calls] += counts[:E]
        self.moe_calls += 1
