"""Model configs for the decode engine: one @dataclass, derived sizes in __post_init__, named
configs behind from_name(). A config describes the GLOBAL model plus the tensor-parallel slice this
process computes (tp_rank of tp_size): heads, routed experts, the dense/shared MLP and the vocab are
split across ranks; the latent KV (one MLA head) and the router are replicated.

`kimi-k2-tp8-rank` is Kimi K2 at TP8 computed by one process: 8 of the 64 heads, 48 of the 384
experts, 1/8 of the vocab. Run alone (no process group) the all-reduce points are skipped, which is
exactly the per-rank work of the TP8 deployment (the numbers are partial sums, fine for timing).

Letters: B batch, T tree tokens, H heads on this rank, D hidden, C = 512 latent, R = 64 rope.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace

KV_LORA_RANK = 512  # fixed by the verify_attention contract (576 = 512 + 64)
QK_ROPE = 64
EXPERT_QUANTS = ("none", "int4")
ROUTINGS = ("random", "uniform", "skewed")
DEFAULT_SKEW = 2.0  # skewed without a number: the hottest expert carries 2x the mean load


def parse_routing(spec: str) -> tuple[str, float]:
    """'random' | 'uniform' | 'skewed[:imbalance]' -> (name, imbalance) (imbalance 1 unless skewed)."""
    name, _, arg = str(spec).partition(":")
    if name not in ROUTINGS or (arg and name != "skewed"):
        raise ValueError(f"routing: expected random, uniform or skewed[:imbalance], got {spec!r}")
    if name != "skewed":
        return name, 1.0
    try:
        imbalance = float(arg) if arg else DEFAULT_SKEW
    except ValueError:
        raise ValueError(f"routing: expected a number after 'skewed:', got {spec!r}") from None
    if not imbalance >= 1.0:
        raise ValueError(f"routing: expected an imbalance >= 1 (max/mean expected load), got {spec!r}")
    return name, imbalance


@dataclass
class ModelConfig:
    name: str = "tiny"
    # --- target model (global sizes, HF DeepseekV3 names in comments)
    vocab_size: int = 96  # vocab_size
    hidden: int = 64  # hidden_size
    n_layers: int = 3  # num_hidden_layers (the layer-count knob)
    first_dense: int = 1  # first_k_dense_replace
    n_heads: int = 4  # num_attention_heads
    q_lora_rank: int = 48
    kv_lora_rank: int = KV_LORA_RANK
    qk_nope: int = 16  # qk_nope_head_dim
    qk_rope: int = QK_ROPE  # qk_rope_head_dim
    v_head: int = 16  # v_head_dim
    intermediate: int = 96  # intermediate_size (dense layers)
    moe_intermediate: int = 32  # moe_intermediate_size
    n_experts: int = 8  # n_routed_experts
    top_k: int = 2  # num_experts_per_tok
    n_shared: int = 1  # n_shared_experts
    routed_scaling: float = 1.0  # routed_scaling_factor
    rms_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_factor: float = 1.0  # rope_scaling.factor (YaRN); 1 = plain RoPE
    rope_original_max: int = 4096  # rope_scaling.original_max_position_embeddings
    beta_fast: float = 32.0
    beta_slow: float = 1.0
    mscale: float = 1.0
    mscale_all_dim: float = 0.0
    dtype: str = "float32"  # weights and activations (verify attention always runs in bf16)
    page_size: int = 64
    # --- drafter (DFlash-style block drafter)
    draft_hidden: int = 64
    draft_heads: int = 4
    draft_layers: int = 1
    draft_intermediate: int = 128
    draft_block: int = 16  # L: positions filled by one drafter forward
    draft_top_k: int = 4  # K: candidates per position
    feature_layers: tuple = (0, 1, 2)  # target layers whose hidden states feed the drafter
    # --- routed-expert weights and routing (kdengine.engine.moe)
    expert_quant: str = "none"  # none: experts in `dtype` | int4: compressed-tensors pack-quantized (W4A16)
    expert_group: int = 32  # INT4 group size along the input dim (Kimi K2.x: 32)
    routing: str = "random"  # random (the router) | uniform | skewed[:imbalance] (see moe.py)
    # --- tensor parallel slice of this process
    tp_rank: int = 0
    tp_size: int = 1
    # --- derived (__post_init__)
    q_head: int = field(init=False)
    local_heads: int = field(init=False)
    local_experts: int = field(init=False)
    local_vocab: int = field(init=False)
    local_intermediate: int = field(init=False)
    local_shared_intermediate: int = field(init=False)
    sm_scale: float = field(init=False)
    draft_head_dim: int = field(init=False)

    def __post_init__(self):
        if self.kv_lora_rank != KV_LORA_RANK or self.qk_rope != QK_ROPE:
            raise ValueError(f"kv_lora_rank/qk_rope: expected {KV_LORA_RANK}/{QK_ROPE}, got {self.kv_lora_rank}/{self.qk_rope}")
        if not 0 <= self.tp_rank < self.tp_size:
            raise ValueError(f"tp_rank: expected 0 <= tp_rank < tp_size={self.tp_size}, got {self.tp_rank}")
        for name in ("n_heads", "n_experts", "vocab_size", "intermediate", "moe_intermediate"):
            if getattr(self, name) % self.tp_size:
                raise ValueError(f"{name}: expected a multiple of tp_size={self.tp_size}, got {getattr(self, name)}")
        if not 1 <= self.first_dense <= self.n_layers:
            raise ValueError(f"n_layers: expected >= first_dense={self.first_dense}, got {self.n_layers}")
        if self.expert_quant not in EXPERT_QUANTS:
            raise ValueError(f"expert_quant: expected one of {EXPERT_QUANTS}, got {self.expert_quant!r}")
        if self.expert_quant == "int4" and (self.expert_group % 8 or self.hidden % self.expert_group
                                            or self.moe_intermediate % self.expert_group):
            raise ValueError(f"expert_group: expected a multiple of 8 dividing hidden={self.hidden} and "
                             f"moe_intermediate={self.moe_intermediate}, got {self.expert_group}")
        _, imbalance = parse_routing(self.routing)
        if imbalance > self.n_experts / self.top_k:
            raise ValueError(f"routing: expected an imbalance <= n_experts/top_k = {self.n_experts / self.top_k:g}, got {imbalance:g}")
        self.feature_layers = tuple(sorted({min(i, self.n_layers - 1) for i in self.feature_layers}))
        self.q_head = self.qk_nope + self.qk_rope
        self.local_heads = self.n_heads // self.tp_size
        self.local_experts = self.n_experts // self.tp_size
        self.local_vocab = self.vocab_size // self.tp_size
        self.local_intermediate = self.intermediate // self.tp_size
        self.local_shared_intermediate = self.moe_intermediate * self.n_shared // self.tp_size
        self.sm_scale = softmax_scale(self)
        self.draft_head_dim = self.draft_hidden // self.draft_heads

    @classmethod
    def from_name(cls, name: str, **overrides) -> ModelConfig:
        """A named config with overrides (e.g. n_layers=8, dtype="float64", tp_rank=1)."""
        if name not in CONFIGS:
            raise ValueError(f"config: expected one of {sorted(CONFIGS)}, got {name!r}")
        known = {f.name for f in fields(cls) if f.init}
        bad = sorted(set(overrides) - known)
        if bad:
            raise ValueError(f"overrides: unknown config fields {bad}")
        return cls(**{**CONFIGS[name], "name": name, **overrides})

    def with_layers(self, n_layers: int) -> ModelConfig:
        return replace(self, n_layers=n_layers)

    def is_moe(self, layer: int) -> bool:
        return layer >= self.first_dense


# ---------------------------------------------------------------------------- scale and sharding


def yarn_mscale(factor: float, mscale: float) -> float:
    """DeepseekV3's yarn_get_mscale: 0.1 * mscale * ln(factor) + 1 (1 when factor <= 1)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def softmax_scale(cfg: ModelConfig) -> float:
    """(qk_nope + qk_rope)^-0.5 * m^2 with m = yarn_mscale(factor, mscale_all_dim), as DeepseekV3 does."""
    base = cfg.q_head**-0.5
    if cfg.mscale_all_dim:
        m = yarn_mscale(cfg.rope_factor, cfg.mscale_all_dim)
        base *= m * m
    return base


def shard_range(total: int, cfg: ModelConfig) -> tuple[int, int]:
    """[start, end) of this rank's contiguous shard of `total` items."""
    n = total // cfg.tp_size
    return cfg.tp_rank * n, (cfg.tp_rank + 1) * n


def head_range(cfg: ModelConfig) -> tuple[int, int]:
    return shard_range(cfg.n_heads, cfg)


def expert_range(cfg: ModelConfig) -> tuple[int, int]:
    return shard_range(cfg.n_experts, cfg)


def vocab_range(cfg: ModelConfig) -> tuple[int, int]:
    return shard_range(cfg.vocab_size, cfg)


# ---------------------------------------------------------------------------- named configs

CONFIGS: dict[str, dict] = {
    "tiny": dict(),
    # tiny with heads and experts divisible by 8: the TP=8 launch path on the CPU (8 gloo processes)
    "tiny-tp8": dict(n_heads=8, n_experts=16),
    # Kimi K2 (HF config of moonshotai/Kimi-K2-Instruct, DeepseekV3 architecture) sliced for TP8.
    "kimi-k2-tp8-rank": dict(
        vocab_size=163840,
        hidden=7168,
        n_layers=8,
        first_dense=1,
        n_heads=64,
        q_lora_rank=1536,
        qk_nope=128,
        v_head=128,
        intermediate=18432,
        moe_intermediate=2048,
        n_experts=384,
        top_k=8,
        n_shared=1,
        routed_scaling=2.827,
        rope_theta=50000.0,
        rope_factor=32.0,
        rope_original_max=4096,
        beta_fast=1.0,
        beta_slow=1.0,
        mscale=1.0,
        mscale_all_dim=1.0,
        dtype="bfloat16",
        draft_hidden=2048,
        draft_heads=16,
        draft_layers=2,
        draft_intermediate=6144,
        draft_top_k=8,
        feature_layers=(1, 4, 7),
        tp_size=8,
    ),
}


# ---------------------------------------------------------------------------- memory


def weight_bytes(cfg: ModelConfig) -> dict[str, int]:
    """Bytes of this rank's weights by part (bf16/fp32 per cfg.dtype), to decide how many layers fit."""
    e = 2 if cfg.dtype == "bfloat16" else (4 if cfg.dtype == "float32" else 8)
    H, D = cfg.local_heads, cfg.hidden
    attn = D * cfg.q_lora_rank + cfg.q_lora_rank * H * cfg.q_head + D * (KV_LORA_RANK + QK_ROPE)
    attn += KV_LORA_RANK * H * (cfg.qk_nope + cfg.v_head) + H * cfg.v_head * D
    moe = 3 * D * cfg.local_shared_intermediate + cfg.n_experts * D
    dense = 3 * D * cfg.local_intermediate
    n_moe = cfg.n_layers - cfg.first_dense
    embed = 2 * cfg.local_vocab * D
    return {
        "attention": e * attn * cfg.n_layers,
        "moe": (e * moe + cfg.local_experts * expert_bytes(cfg)) * n_moe,
        "dense_mlp": e * dense * cfg.first_dense,
        "embed_and_head": e * embed,
        "per_moe_layer": e * (attn + moe) + cfg.local_experts * expert_bytes(cfg),
    }


def expert_bytes(cfg: ModelConfig) -> int:
    """Bytes of one routed expert's three matrices: INT4 = packed nibbles + bf16 group scales, else dtype."""
    n = 3 * cfg.hidden * cfg.moe_intermediate
    if cfg.expert_quant == "int4":
        scale = 2 if cfg.dtype == "bfloat16" else (4 if cfg.dtype == "float32" else 8)
        return n // 2 + n // cfg.expert_group * scale
    return n * (2 if cfg.dtype == "bfloat16" else (4 if cfg.dtype == "float32" else 8))


def kv_bytes(cfg: ModelConfig, context: int) -> int:
    """bf16 latent KV of one sequence of `context` tokens over all layers."""
    return cfg.n_layers * context * (KV_LORA_RANK + QK_ROPE) * 2


def max_layers_that_fit(cfg: ModelConfig, device_bytes: int, context: int, reserve: int = 6 << 30) -> int:
    """Largest n_layers whose weights + KV at `context` fit in device_bytes minus `reserve`
    (activations, drafter, CUDA graphs, allocator slack)."""
    best = cfg.first_dense
    for n in range(cfg.first_dense, 1000):
        c = cfg.with_layers(n)
        total = sum(v for k, v in weight_bytes(c).items() if k != "per_moe_layer") + kv_bytes(c, context)
        if total > device_bytes - reserve:
            break
        best = n
    return best
