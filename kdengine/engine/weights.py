"""Weights: random init directly on the device (fast, seeded), and a loader for DeepseekV3/Kimi-format
safetensors checkpoints (HF tensor names, sharded through model.safetensors.index.json) that reads
only this tensor-parallel rank's slices. hf_state_dict() is the inverse (tp_size 1), used to write
test checkpoints. bf16/fp32 checkpoints only (FP8 block-quantized ones need dequantizing first).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from kdengine.engine.config import ModelConfig, expert_range, head_range, shard_range, vocab_range
from kdengine.engine.model import MoE, Transformer, torch_dtype

INDEX = "model.safetensors.index.json"


def materialize(module_cls, cfg: ModelConfig, device, seed: int = 0) -> nn.Module:
    """Build module_cls(cfg) without a CPU init, on `device` in cfg.dtype, randomly initialized."""
    with torch.device("meta"):
        module = module_cls(cfg).to(torch_dtype(cfg.dtype))  # free on meta: no fp32 copy on the device
    module = module.to_empty(device=device)
    init_random(module, seed)
    return module.eval().requires_grad_(False)


def init_random(module: nn.Module, seed: int) -> None:
    """Norm weights 1, router bias 0, everything else N(0, 1/fan_in) (embeddings N(0, 1))."""
    device = next(module.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name:
                p.fill_(1.0)
            elif name.endswith("e_score_correction_bias"):
                p.zero_()
            elif "embed" in name or name.endswith(("block_pos", "mask_embed")):
                p.normal_(0.0, 1.0, generator=gen)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)


# ---------------------------------------------------------------------------- HF name map


def rows(total: int, cfg: ModelConfig):
    """(dim, start, end) of this rank's shard of `total` rows (dim 0)."""
    return (0, *shard_range(total, cfg))


def tensor_specs(cfg: ModelConfig) -> dict[str, tuple[str, tuple | None, tuple | None]]:
    """HF name -> (model parameter name, this rank's slice (dim, start, end) or None, expert target).
    Expert target: (local expert, 'gate'|'up'|'down') for routed-expert tensors, else None."""
    H0, H1 = head_range(cfg)
    specs = {
        "model.embed_tokens.weight": ("embed_tokens", (0, *vocab_range(cfg)), None),
        "model.norm.weight": ("norm.weight", None, None),
        "lm_head.weight": ("lm_head.weight", (0, *vocab_range(cfg)), None),
    }
    for i in range(cfg.n_layers):
        hf, me = f"model.layers.{i}.", f"layers.{i}."
        for n in ("input_layernorm", "post_attention_layernorm", "self_attn.q_a_layernorm", "self_attn.kv_a_layernorm"):
            specs[hf + n + ".weight"] = (me + n + ".weight", None, None)
        for n in ("q_a_proj", "kv_a_proj_with_mqa"):
            specs[f"{hf}self_attn.{n}.weight"] = (f"{me}self_attn.{n}.weight", None, None)
        specs[hf + "self_attn.q_b_proj.weight"] = (me + "self_attn.q_b_proj.weight", (0, H0 * cfg.q_head, H1 * cfg.q_head), None)
        kvb = cfg.qk_nope + cfg.v_head
        specs[hf + "self_attn.kv_b_proj.weight"] = (me + "self_attn.kv_b_proj.weight", (0, H0 * kvb, H1 * kvb), None)
        specs[hf + "self_attn.o_proj.weight"] = (me + "self_attn.o_proj.weight", (1, H0 * cfg.v_head, H1 * cfg.v_head), None)
        if not cfg.is_moe(i):
            add_mlp(specs, hf + "mlp.", me + "mlp.", shard_range(cfg.intermediate, cfg))
            continue
        specs[hf + "mlp.gate.weight"] = (me + "mlp.gate.weight", None, None)
        specs[hf + "mlp.gate.e_score_correction_bias"] = (me + "mlp.gate.e_score_correction_bias", None, None)
        add_mlp(specs, hf + "mlp.shared_experts.", me + "mlp.shared_experts.", shard_range(cfg.moe_intermediate * cfg.n_shared, cfg))
        e0, e1 = expert_range(cfg)
        for e in range(e0, e1):
            for part, target in (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down")):
                param = me + ("mlp.experts_down" if target == "down" else "mlp.experts_gate_up")
                specs[f"{hf}mlp.experts.{e}.{part}.weight"] = (param, None, (e - e0, target))
    return specs


def add_mlp(specs: dict, hf: str, me: str, inter: tuple[int, int]) -> None:
    for n in ("gate_proj", "up_proj"):
        specs[f"{hf}{n}.weight"] = (f"{me}{n}.weight", (0, *inter), None)
    specs[f"{hf}down_proj.weight"] = (f"{me}down_proj.weight", (1, *inter), None)


def assign(params: dict, spec, tensor: torch.Tensor, cfg: ModelConfig) -> None:
    """Copy one (already sliced) HF tensor into its model parameter."""
    name, _, expert = spec
    p = params[name]
    with torch.no_grad():
        if expert is None:
            if p.shape != tensor.shape:
                raise ValueError(f"{name}: expected shape {list(p.shape)}, got {list(tensor.shape)} from the checkpoint")
            p.copy_(tensor)
            return
        e, part = expert
        I = cfg.moe_intermediate
        dst = {"gate": p[e, :I], "up": p[e, I:], "down": p[e]}[part]
        if dst.shape != tensor.shape:
            raise ValueError(f"{name}[{e}].{part}: expected shape {list(dst.shape)}, got {list(tensor.shape)}")
        dst.copy_(tensor)


# ---------------------------------------------------------------------------- load / export


def checkpoint_files(path: Path) -> dict[str, str]:
    """HF name -> file, from the index (sharded) or the single model.safetensors."""
    path = Path(path)
    if (path / INDEX).exists():
        return json.loads((path / INDEX).read_text())["weight_map"]
    single = path / "model.safetensors"
    if not single.exists():
        raise ValueError(f"path: expected {INDEX} or model.safetensors in {path}, found neither")
    from safetensors import safe_open

    with safe_open(str(single), framework="pt") as f:
        return {k: "model.safetensors" for k in f.keys()}


def load_checkpoint(model: Transformer, path) -> list[str]:
    """Fill `model` (this rank's shapes) from a DeepseekV3-format checkpoint directory. Returns the
    checkpoint names not used (other layers, MTP heads). Raises ValueError on a missing tensor."""
    from safetensors import safe_open

    cfg, path = model.cfg, Path(path)
    weight_map = checkpoint_files(path)
    specs = tensor_specs(cfg)
    missing = sorted(set(specs) - set(weight_map))
    if missing:
        raise ValueError(f"path: checkpoint lacks {len(missing)} tensors this config needs, e.g. {missing[:3]}")
    params = dict(model.named_parameters())
    by_file: dict[str, list[str]] = {}
    for name in specs:
        by_file.setdefault(weight_map[name], []).append(name)
    for file, names in by_file.items():
        with safe_open(str(path / file), framework="pt", device="cpu") as f:
            for name in names:
                sl = f.get_slice(name)
                cut = specs[name][1]
                if cut is None:
                    t = sl[:]
                elif cut[0] == 0:
                    t = sl[cut[1] : cut[2]]
                else:
                    t = sl[:, cut[1] : cut[2]]
                assign(params, specs[name], t, cfg)
    return sorted(set(weight_map) - set(specs))


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under HF DeepseekV3 names (a tp_size 1 model; CPU, contiguous)."""
    cfg = model.cfg
    if cfg.tp_size != 1:
        raise ValueError(f"model: expected tp_size 1 to export, got {cfg.tp_size}")
    params = dict(model.named_parameters())
    I, out = cfg.moe_intermediate, {}
    for name, (pname, _, expert) in tensor_specs(cfg).items():
        p = params[pname].detach()
        if expert is not None:
            e, part = expert
            p = {"gate": p[e, :I], "up": p[e, I:], "down": p[e]}[part]
        out[name] = p.cpu().contiguous().clone()
    return out


def moe_layers(model: Transformer) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]
