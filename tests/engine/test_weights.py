"""Safetensors loader: a tiny DeepseekV3-format checkpoint (sharded, with an index) written by the
test loads back exactly, a TP rank loads exactly its slices, and a missing tensor is a ValueError."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from kdengine.engine.config import ModelConfig
from kdengine.engine.model import Transformer
from kdengine.engine.weights import INDEX, hf_state_dict, load_checkpoint, materialize


def write_checkpoint(tmp_path, state: dict, shards: int = 3, extra: dict | None = None):
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        part = {n: state[n] for n in names[i::shards]}
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(tmp_path / file))
        weight_map.update(dict.fromkeys(part, file))
    if extra:
        save_file(extra, str(tmp_path / "extra.safetensors"))
        weight_map.update(dict.fromkeys(extra, "extra.safetensors"))
    (tmp_path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))


def test_round_trip_loads_every_tensor(tmp_path):
    cfg = ModelConfig.from_name("tiny")
    source = materialize(Transformer, cfg, "cpu", seed=3)
    state = hf_state_dict(source)
    assert "model.layers.1.mlp.experts.5.down_proj.weight" in state
    assert "model.layers.0.self_attn.kv_a_proj_with_mqa.weight" in state
    mtp = {"model.layers.99.mlp.gate.weight": torch.randn(2, 2)}
    write_checkpoint(tmp_path, state, extra=mtp)
    target = materialize(Transformer, cfg, "cpu", seed=4)
    unused = load_checkpoint(target, tmp_path)
    assert unused == sorted(mtp)
    for (name, a), (_, b) in zip(source.named_parameters(), target.named_parameters(), strict=True):
        assert torch.equal(a, b), name


def test_tp_rank_loads_its_slices(tmp_path):
    full_cfg = ModelConfig.from_name("tiny")
    source = materialize(Transformer, full_cfg, "cpu", seed=5)
    write_checkpoint(tmp_path, hf_state_dict(source), shards=2)
    rank = materialize(Transformer, ModelConfig.from_name("tiny", tp_size=2, tp_rank=1), "cpu", seed=6)
    load_checkpoint(rank, tmp_path)
    cfg = rank.cfg
    H, qh = cfg.local_heads, cfg.q_head
    src, dst = source.layers[1], rank.layers[1]
    assert torch.equal(dst.self_attn.q_b_proj.weight, src.self_attn.q_b_proj.weight[H * qh : 2 * H * qh])
    assert torch.equal(dst.self_attn.o_proj.weight, src.self_attn.o_proj.weight[:, H * cfg.v_head :])
    E = cfg.local_experts
    assert torch.equal(dst.mlp.experts_gate_up, src.mlp.experts_gate_up[E:])
    assert torch.equal(dst.mlp.gate.weight, src.mlp.gate.weight)
    V = cfg.local_vocab
    assert torch.equal(rank.lm_head.weight, source.lm_head.weight[V:])
    I = cfg.local_intermediate
    assert torch.equal(rank.layers[0].mlp.down_proj.weight, source.layers[0].mlp.down_proj.weight[:, I:])


def test_missing_tensor_raises(tmp_path):
    cfg = ModelConfig.from_name("tiny")
    state = hf_state_dict(materialize(Transformer, cfg, "cpu"))
    del state["model.layers.2.self_attn.o_proj.weight"]
    write_checkpoint(tmp_path, state, shards=1)
    with pytest.raises(ValueError, match="lacks 1 tensors"):
        load_checkpoint(materialize(Transformer, cfg, "cpu"), tmp_path)


def test_random_init_is_seeded_and_not_zero():
    cfg = ModelConfig.from_name("tiny")
    a, b = materialize(Transformer, cfg, "cpu", seed=1), materialize(Transformer, cfg, "cpu", seed=1)
    w = a.layers[1].mlp.experts_down
    assert torch.equal(w, b.layers[1].mlp.experts_down) and w.abs().min() >= 0 and w.std() > 0
