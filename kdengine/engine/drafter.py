"""DFlash-style block drafter: one forward fills a block of L positions after the root token from the
target's hidden states, giving the top-K log-probs per position (the DDTree input).

Context: the target's hidden states of a few layers (cfg.feature_layers) for every committed token
are concatenated, projected to the drafter width, and turned into per-layer K/V rows of the
drafter's own context cache once, when the tokens are committed. Block: the root token followed by
L-1 mask tokens (plus learned block-position embeddings); the block attends to the whole context
cache and bidirectionally to itself: split-KV flash decoding (kdengine.engine.draft_attention) where it
runs (bf16/fp16 on a GPU), else torch's scaled_dot_product_attention with a length mask. Lengths live on
the device, so the forward is CUDA-graph safe.

Letters: B batch, L block, S context capacity, Hd drafter heads, dh head dim, Dd drafter width,
F = len(feature_layers) * D target features, K candidates per position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from kdengine.engine import draft_attention as split_kv
from kdengine.engine.config import ModelConfig
from kdengine.engine.model import DenseMLP, RMSNorm


class DraftLayer(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        Dd = cfg.draft_hidden
        self.norm = RMSNorm(Dd, cfg.rms_eps)
        self.ctx_norm = RMSNorm(Dd, cfg.rms_eps)
        self.q_proj = nn.Linear(Dd, Dd, bias=False)
        self.k_proj = nn.Linear(Dd, Dd, bias=False)
        self.v_proj = nn.Linear(Dd, Dd, bias=False)
        self.o_proj = nn.Linear(Dd, Dd, bias=False)
        self.mlp_norm = RMSNorm(Dd, cfg.rms_eps)
        self.mlp = DenseMLP(Dd, cfg.draft_intermediate)


class Drafter(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.cfg = cfg
        n_feat = len(cfg.feature_layers)
        self.fc = nn.Linear(n_feat * cfg.hidden, cfg.draft_hidden, bias=False)
        self.embed_tokens = nn.Parameter(torch.empty(cfg.vocab_size, cfg.draft_hidden))
        self.block_pos = nn.Parameter(torch.empty(cfg.draft_block, cfg.draft_hidden))
        self.mask_embed = nn.Parameter(torch.empty(cfg.draft_hidden))
        self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.draft_layers))
        self.norm = RMSNorm(cfg.draft_hidden, cfg.rms_eps)
        self.lm_head = nn.Linear(cfg.draft_hidden, cfg.vocab_size, bias=False)


# ---------------------------------------------------------------------------- context cache


class DraftCache:
    """Per drafter layer K/V of the committed context. k, v [n_layers, B, Hd, S, dh]; lengths [B] int32."""

    def __init__(self, cfg: ModelConfig, batch: int, capacity: int, device, dtype):
        shape = (cfg.draft_layers, batch, cfg.draft_heads, capacity, cfg.draft_head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.lengths = torch.zeros(batch, dtype=torch.int32, device=device)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def fill_random(self, n_tokens: int, generator=None) -> None:
        """Synthetic context: random K/V rows for the first n_tokens of every sequence."""
        if n_tokens > self.capacity:
            raise ValueError(f"n_tokens: expected <= capacity {self.capacity}, got {n_tokens}")
        for t in (self.k, self.v):
            rows = torch.randn(t[:, :, :, :n_tokens].shape, generator=generator, device=t.device)
            t[:, :, :, :n_tokens] = rows.to(t.dtype)
        self.lengths.fill_(n_tokens)


def heads(x: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """[B, N, Dd] -> [B, Hd, N, dh]."""
    B, N, _ = x.shape
    return x.view(B, N, cfg.draft_heads, cfg.draft_head_dim).transpose(1, 2)


def append_context(drafter: Drafter, cache: DraftCache, features: torch.Tensor, count: torch.Tensor) -> None:
    """Add the first count[b] rows of features [B, T, F] (accepted tokens, in order) to the context
    cache of each sequence and advance its length; rows past count land beyond the length (ignored)."""
    cfg = drafter.cfg
    B, T, _ = features.shape
    ctx = drafter.fc(features.to(drafter.fc.weight.dtype))  # [B, T, Dd]
    pos = (cache.lengths[:, None].long() + torch.arange(T, device=features.device)).clamp(max=cache.capacity - 1)
    index = pos[:, None, :, None].expand(B, cfg.draft_heads, T, cfg.draft_head_dim)
    for i, layer in enumerate(drafter.layers):
        c = layer.ctx_norm(ctx)
        cache.k[i].scatter_(2, index, heads(layer.k_proj(c), cfg).to(cache.k.dtype))
        cache.v[i].scatter_(2, index, heads(layer.v_proj(c), cfg).to(cache.v.dtype))
    cache.lengths += count.to(torch.int32)


# ---------------------------------------------------------------------------- block forward


def draft_block(drafter: Drafter, cache: DraftCache, root: torch.Tensor):
    """One forward over the block [root, mask * (L-1)] -> top-K (log_probs, ids), each [B, L, K];
    position i predicts the token at depth i+1 below the root."""
    cfg = drafter.cfg
    B, L = root.shape[0], cfg.draft_block
    x = torch.cat([drafter.embed_tokens[root][:, None], drafter.mask_embed.expand(B, L - 1, -1)], 1)
    x = x + drafter.block_pos  # [B, L, Dd]
    S = cache.capacity
    # The block's own K/V go into the cache slots just past the context (append_context overwrites
    # them later), so attention reads the cache in place: keys 0 .. lengths+L-1 are visible.
    slots = (cache.lengths[:, None].long() + torch.arange(L, device=root.device)).clamp(max=S - 1)
    index = slots[:, None, :, None].expand(B, cfg.draft_heads, L, cfg.draft_head_dim)
    visible = torch.arange(S, device=root.device)[None, :] < (cache.lengths[:, None] + L)  # [B, S]
    attn_mask = visible[:, None, None, :]  # [B, 1, 1, S]
    for i, layer in enumerate(drafter.layers):
        h = layer.norm(x)
        q = heads(layer.q_proj(h), cfg)  # [B, Hd, L, dh]
        cache.k[i].scatter_(2, index, heads(layer.k_proj(h), cfg).to(cache.k.dtype))
        cache.v[i].scatter_(2, index, heads(layer.v_proj(h), cfg).to(cache.v.dtype))
        o = context_attention(q, cache.k[i], cache.v[i], cache.lengths, attn_mask)
        x = x + layer.o_proj(o.transpose(1, 2).reshape(B, L, -1))
        x = x + layer.mlp(layer.mlp_norm(x))
    log_probs = torch.log_softmax(drafter.lm_head(drafter.norm(x)).float(), -1)  # [B, L, V]
    top = torch.topk(log_probs, cfg.draft_top_k, dim=-1)  # sorted descending
    return top.values, top.indices


def context_attention(q, k, v, lengths, attn_mask):
    """q [B, Hd, L, dh] over the visible keys of k/v [B, Hd, S, dh]: the split-KV kernel where it
    serves these tensors (its cost follows the lengths, not the capacity S), else SDPA with the mask."""
    if split_kv.unavailable_reason(q) is None and k.dtype == q.dtype:
        return split_kv.draft_attention(q, k, v, lengths)
    return F.scaled_dot_product_attention(q, k.to(q.dtype), v.to(q.dtype), attn_mask=attn_mask)
