"""Weights: random init directly on the device (fast, seeded), and a loader for DeepseekV3/Kimi-format
safetensors checkpoints (HF tensor names, sharded through model.safetensors.index.json) that reads
only this tensor-parallel rank's slices. hf_state_dict() is the inverse (tp_size 1), used to write
test checkpoints. Routed experts may be compressed-tensors pack-quantized INT4 (Kimi K2-Thinking /
K2.5 / K2.6: `experts.{e}.{gate,up,down}_proj.weight_packed` int32 [out, in/8], `weight_scale` [out,
in/32], `weight_shape` int64 [2], declared by config.json's quantization_config; format in
kdengine.ops.int4): loaded as INT4 into a cfg.expert_quant="int4" model, or dequantized into a dense
one. Other schemes (FP8 blocks, asymmetric, act-order, W4A8...) raise ValueError.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn

from kdengine.engine.config import ModelConfig, expert_range, head_range, shard_range, vocab_range
from kdengine.engine.model import MoE, Transformer, torch_dtype
from kdengine.ops.int4 import dequantize_int4, pack_int4, quantize_int4

INDEX = "model.safetensors.index.json"
CONFIG = "config.json"
PARTS = (("gate_proj", "gate"), ("up_proj", "up"), ("down_proj", "down"))
Q_SUFFIXES = ("weight_packed", "weight_scale", "weight_shape")


def materialize(module_cls, cfg: ModelConfig, device, seed: int = 0) -> nn.Module:
    """Build module_cls(cfg) without a CPU init, on `device` in cfg.dtype, randomly initialized."""
    with torch.device("meta"):
        module = module_cls(cfg).to(torch_dtype(cfg.dtype))  # free on meta: no fp32 copy on the device
    module = module.to_empty(device=device)
    init_random(module, seed)
    return module.eval().requires_grad_(False)


def init_random(module: nn.Module, seed: int) -> None:
    """Norm weights 1, router bias 0, everything else N(0, 1/fan_in) (embeddings N(0, 1)). INT4
    experts: uniformly random nibbles, scales such that the weights' std is ~1/sqrt(fan_in)
    (x U[0.75, 1.25] per group). MoE routing state is reset per layer."""
    device = next(module.parameters()).device
    gen = torch.Generator(device=device).manual_seed(seed)
    params = dict(module.named_parameters())
    with torch.no_grad():
        for name, p in params.items():
            if p.dtype == torch.int32:
                p.random_(-(2**31), 2**31 - 1, generator=gen)
            elif name.endswith("_scale"):
                fan_in = params[name[: -len("_scale")] + "_packed"].shape[-1] * 8
                p.uniform_(0.75, 1.25, generator=gen).mul_(1.0 / (INT4_STD * math.sqrt(fan_in)))
            elif "norm" in name:
                p.fill_(1.0)
            elif name.endswith("e_score_correction_bias"):
                p.zero_()
            elif "embed" in name or name.endswith(("block_pos", "mask_embed")):
                p.normal_(0.0, 1.0, generator=gen)
            else:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]), generator=gen)
        for salt, m in enumerate(x for x in module.modules() if isinstance(x, MoE)):
            m.reset_routing(salt, seed)


INT4_STD = math.sqrt((16**2 - 1) / 12)  # std of a uniform nibble in [-8, 7]


# ---------------------------------------------------------------------------- HF name map


def rows(total: int, cfg: ModelConfig):
    """(dim, start, end) of this rank's shard of `total` rows (dim 0)."""
    return (0, *shard_range(total, cfg))


def tensor_specs(cfg: ModelConfig, experts: str = "dense") -> dict[str, tuple[str, tuple | None, tuple | None]]:
    """HF name -> (model parameter name, this rank's slice (dim, start, end) or None, expert target).
    Expert target: (local expert, 'gate'|'up'|'down') for routed-expert tensors, else None.
    experts="int4": the routed experts are the checkpoint's packed triplets, named "<dense param>:<suffix>"."""
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
            for part, target in PARTS:
                param = me + ("mlp.experts_down" if target == "down" else "mlp.experts_gate_up")
                if experts == "int4":
                    for suffix in Q_SUFFIXES:
                        specs[f"{hf}mlp.experts.{e}.{part}.{suffix}"] = (f"{param}:{suffix}", None, (e - e0, target))
                else:
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
        dst = expert_rows(p, expert, cfg)
        if dst.shape != tensor.shape:
            raise ValueError(f"{name}[{expert[0]}].{expert[1]}: expected shape {list(dst.shape)}, got {list(tensor.shape)}")
        dst.copy_(tensor)


def expert_rows(p: torch.Tensor, expert: tuple[int, str], cfg: ModelConfig) -> torch.Tensor:
    """The rows of expert parameter p [E, 2I | D, ...] that hold local expert e's gate, up or down."""
    e, part = expert
    I = cfg.moe_intermediate
    return {"gate": p[e, :I], "up": p[e, I:], "down": p[e]}[part]


def assign_expert_int4(params: dict, spec, suffix: str, tensor: torch.Tensor, cfg: ModelConfig, pending: dict) -> None:
    """One tensor of a packed triplet: copied into the INT4 parameters (cfg.expert_quant int4), or
    kept until its pair arrives and then dequantized into the dense parameter."""
    name, _, expert = spec
    dense = name.split(":")[0]
    if suffix == "weight_shape":
        want = [cfg.moe_intermediate, cfg.hidden] if expert[1] != "down" else [cfg.hidden, cfg.moe_intermediate]
        if tensor.tolist() != want:
            raise ValueError(f"{dense}[{expert[0]}].{expert[1]}.weight_shape: expected {want}, got {tensor.tolist()}")
        return
    if cfg.expert_quant == "int4":
        kind = "packed" if suffix == "weight_packed" else "scale"
        assign(params, (f"{dense}_{kind}", None, expert), tensor.to(params[f"{dense}_{kind}"].dtype), cfg)
        return
    got = pending.setdefault((dense, expert), {})
    got[suffix] = tensor
    if len(got) == 2:
        w = dequantize_int4(got["weight_packed"], got["weight_scale"], params[dense].dtype, group=pending["group"])
        assign(params, (dense, None, expert), w, cfg)
        del pending[(dense, expert)]


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
    group = read_quantization(path)
    packed = any(".mlp.experts." in n and n.endswith(".weight_packed") for n in weight_map)
    if packed and group is None:
        raise ValueError(f"path: {path} holds weight_packed expert tensors but no compressed-tensors quantization_config in {CONFIG}")
    if not packed and cfg.expert_quant == "int4":
        raise ValueError(f"path: expected INT4 (weight_packed) experts for cfg.expert_quant='int4', {path} holds dense experts")
    if packed and cfg.expert_quant == "int4" and group != cfg.expert_group:
        raise ValueError(f"path: checkpoint group_size {group} differs from cfg.expert_group {cfg.expert_group}")
    specs = tensor_specs(cfg, "int4" if packed else "dense")
    pending: dict = {"group": group}
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
                if ":" in specs[name][0]:
                    assign_expert_int4(params, specs[name], specs[name][0].split(":")[1], t, cfg, pending)
                else:
                    assign(params, specs[name], t, cfg)
    return sorted(set(weight_map) - set(specs))


def read_quantization(path: Path) -> int | None:
    """The INT4 group size declared by config.json's quantization_config (top level or text_config),
    None without one. ValueError naming the field for any scheme other than compressed-tensors
    pack-quantized, symmetric INT4 weights with per-group scales and no activation quantization."""
    file = Path(path) / CONFIG
    if not file.exists():
        return None
    cfg = json.loads(file.read_text())
    q = cfg.get("quantization_config") or (cfg.get("text_config") or {}).get("quantization_config")
    if not q:
        return None
    return check_quantization(q)


def check_quantization(q: dict) -> int:
    def need(field, got, want):
        if got not in want:
            raise ValueError(f"quantization_config.{field}: expected {' or '.join(map(repr, want))}, got {got!r}")

    need("quant_method", q.get("quant_method"), ("compressed-tensors",))
    need("quantization_status", q.get("quantization_status", "compressed"), ("compressed",))
    groups = q.get("config_groups") or {}
    if not groups:
        raise ValueError("quantization_config.config_groups: expected at least one group, got none")
    sizes = set()
    for gname, g in groups.items():
        w = g.get("weights") or {}
        at = f"config_groups.{gname}"
        need(f"{at}.format", g.get("format") or q.get("format"), ("pack-quantized",))
        need(f"{at}.input_activations", g.get("input_activations"), (None,))
        need(f"{at}.weights.num_bits", w.get("num_bits"), (4,))
        need(f"{at}.weights.type", w.get("type"), ("int",))
        need(f"{at}.weights.symmetric", w.get("symmetric"), (True,))
        need(f"{at}.weights.strategy", w.get("strategy"), ("group",))
        need(f"{at}.weights.actorder", w.get("actorder"), (None, False))
        need(f"{at}.weights.dynamic", w.get("dynamic", False), (False,))
        if not isinstance(w.get("group_size"), int) or w["group_size"] < 8 or w["group_size"] % 8:
            raise ValueError(f"quantization_config.{at}.weights.group_size: expected a multiple of 8, got {w.get('group_size')!r}")
        sizes.add(w["group_size"])
    if len(sizes) != 1:
        raise ValueError(f"quantization_config.config_groups: expected one group_size, got {sorted(sizes)}")
    return sizes.pop()


def quantization_config(group: int = 32) -> dict:
    """The quantization_config Kimi K2-Thinking / K2.6 ship (routed experts INT4, the rest ignored)."""
    weights = {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": group,
               "dynamic": False, "actorder": None, "block_structure": None, "observer": "minmax", "observer_kwargs": {}}
    return {
        "quant_method": "compressed-tensors", "format": "pack-quantized", "quantization_status": "compressed",
        "config_groups": {"group_0": {"targets": ["Linear"], "weights": weights, "input_activations": None,
                                      "output_activations": None}},
        "ignore": ["lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"],
        "kv_cache_scheme": None,
    }


def compress_experts(state: dict[str, torch.Tensor], group: int = 32) -> dict[str, torch.Tensor]:
    """A dense HF state dict with every routed expert's weight replaced by its pack-quantized triplet
    (quantize_int4 + pack_int4, bf16 scales): how a checkpoint in Kimi's format is written."""
    out = {}
    for name, t in state.items():
        if ".mlp.experts." in name and name.endswith(".weight"):
            q, scale = quantize_int4(t, group)
            base = name[: -len("weight")]
            out[base + "weight_packed"] = pack_int4(q)
            out[base + "weight_scale"] = scale
            out[base + "weight_shape"] = torch.tensor(list(t.shape), dtype=torch.int64)
        else:
            out[name] = t
    return out


def hf_state_dict(model: Transformer) -> dict[str, torch.Tensor]:
    """The model's weights under HF DeepseekV3 names (a tp_size 1 model; CPU, contiguous)."""
    cfg = model.cfg
    if cfg.tp_size != 1:
        raise ValueError(f"model: expected tp_size 1 to export, got {cfg.tp_size}")
    params = dict(model.named_parameters())
    out = {}
    for name, (pname, _, expert) in tensor_specs(cfg, "int4" if cfg.expert_quant == "int4" else "dense").items():
        if ":" in pname:
            dense, suffix = pname.split(":")
            if suffix == "weight_shape":
                rows = expert_rows(params[dense + "_packed"], expert, cfg)
                out[name] = torch.tensor([rows.shape[0], rows.shape[1] * 8], dtype=torch.int64)
                continue
            pname = dense + ("_packed" if suffix == "weight_packed" else "_scale")
        p = params[pname].detach()
        if expert is not None:
            p = expert_rows(p, expert, cfg)
        out[name] = p.cpu().contiguous().clone()
    return out


def moe_layers(model: Transformer) -> list[MoE]:
    return [m for m in model.modules() if isinstance(m, MoE)]
