"""MoE of the engine: the INT4 (compressed-tensors pack-quantized) format and loader on checkpoints the
tests write in Kimi's exact layout, the expert paths on INT4 weights, the routing policies, and
lossless speculative decoding with INT4 experts."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import save_file

from kdengine.engine.config import ModelConfig, parse_routing
from kdengine.engine.model import Transformer
from kdengine.engine.moe import MoE, hash_uniform
from kdengine.engine.weights import (
    INDEX,
    compress_experts,
    hf_state_dict,
    load_checkpoint,
    materialize,
    quantization_config,
)
from kdengine.ops.int4 import dequantize_int4, pack_int4, quantize_int4, unpack_int4

# ---------------------------------------------------------------------------- format


def test_packing_order_and_offset_match_compressed_tensors():
    """Value j of a word sits in bits 4j..4j+3, stored as q + 8 (pack_to_int32 / unpack_from_int32)."""
    q = torch.tensor([[-8, -7, 0, 1, 2, 3, 6, 7]], dtype=torch.int8)
    word = int(pack_int4(q)[0, 0]) & 0xFFFFFFFF
    nibbles = [(word >> (4 * j)) & 0xF for j in range(8)]
    assert nibbles == [0, 1, 8, 9, 10, 11, 14, 15]
    assert torch.equal(unpack_int4(pack_int4(q)), q)
    gen = torch.Generator().manual_seed(0)
    q = torch.randint(-8, 8, (5, 3, 64), generator=gen, dtype=torch.int8)
    packed = pack_int4(q)
    assert packed.dtype == torch.int32 and packed.shape == (5, 3, 8) and torch.equal(unpack_int4(packed), q)
    with pytest.raises(ValueError, match="q"):
        pack_int4(torch.full((1, 8), 8))


def test_quantize_round_trip_within_half_a_step():
    w = torch.randn(6, 96, generator=torch.Generator().manual_seed(1))
    q, scale = quantize_int4(w)
    assert scale.dtype == torch.bfloat16 and scale.shape == (6, 3)
    deq = dequantize_int4(pack_int4(q), scale, torch.float32)
    step = scale.float().repeat_interleave(32, -1)
    assert bool(((deq - w).abs() <= step / 2 + 1e-6).all())
    assert float((deq - w).abs().max()) > 0  # it is a quantization


# ---------------------------------------------------------------------------- checkpoints


def write_kimi_checkpoint(path, state: dict, group: int = 32, shards: int = 2, config: dict | None = None):
    names = sorted(state)
    weight_map = {}
    for i in range(shards):
        part = {n: state[n].contiguous() for n in names[i::shards]}
        file = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(part, str(path / file))
        weight_map.update(dict.fromkeys(part, file))
    (path / INDEX).write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    (path / "config.json").write_text(json.dumps(config or {"model_type": "kimi_k2", "quantization_config": quantization_config(group)}))


def test_kimi_format_checkpoint_loads_as_int4_and_dequantizes_exactly(tmp_path):
    dense_cfg = ModelConfig.from_name("tiny", dtype="bfloat16")
    source = materialize(Transformer, dense_cfg, "cpu", seed=3)
    state = compress_experts(hf_state_dict(source))
    name = "model.layers.1.mlp.experts.5.down_proj"
    assert state[name + ".weight_packed"].dtype == torch.int32 and state[name + ".weight_packed"].shape == (64, 4)
    assert state[name + ".weight_scale"].dtype == torch.bfloat16 and state[name + ".weight_scale"].shape == (64, 1)
    assert state[name + ".weight_shape"].dtype == torch.int64 and state[name + ".weight_shape"].tolist() == [64, 32]
    assert name + ".weight" not in state and "model.layers.1.mlp.shared_experts.down_proj.weight" in state
    write_kimi_checkpoint(tmp_path, state)
    model = materialize(Transformer, ModelConfig.from_name("tiny", dtype="bfloat16", expert_quant="int4"), "cpu", seed=4)
    assert load_checkpoint(model, tmp_path) == []
    moe, src = model.layers[1].mlp, source.layers[1].mlp
    assert torch.equal(moe.experts_down_packed[5], state[name + ".weight_packed"])
    gate_up, down = moe.dequantized(dtype=torch.float32)
    ref = dequantize_int4(state[name + ".weight_packed"], state[name + ".weight_scale"], torch.float32)
    assert torch.equal(down[5], ref)
    err = (gate_up - src.experts_gate_up.float()).abs()
    step = moe.experts_gate_up_scale.float().repeat_interleave(32, -1)
    assert bool((err <= step / 2 + 1e-2 * step).all())  # within INT4 error of the bf16 original
    assert torch.equal(model.layers[0].self_attn.q_a_proj.weight, source.layers[0].self_attn.q_a_proj.weight)
    # a dense model reads the same checkpoint dequantized; a TP rank takes its experts only
    dense = materialize(Transformer, dense_cfg, "cpu", seed=5)
    load_checkpoint(dense, tmp_path)
    assert torch.equal(dense.layers[1].mlp.experts_down[5], ref.to(torch.bfloat16))
    rank = materialize(Transformer, ModelConfig.from_name("tiny", dtype="bfloat16", expert_quant="int4", tp_size=2, tp_rank=1), "cpu", seed=6)
    load_checkpoint(rank, tmp_path)
    assert torch.equal(rank.layers[2].mlp.experts_gate_up_packed, model.layers[2].mlp.experts_gate_up_packed[4:])
    # export -> load round trip of an INT4 model is bit-exact
    again = materialize(Transformer, model.cfg, "cpu", seed=7)
    (tmp_path / "b").mkdir()
    write_kimi_checkpoint(tmp_path / "b", hf_state_dict(model))
    load_checkpoint(again, tmp_path / "b")
    for (n, a), (_, b) in zip(model.named_parameters(), again.named_parameters(), strict=True):
        assert torch.equal(a, b), n


@pytest.mark.parametrize("field,value,match", [
    ("num_bits", 8, "num_bits"), ("symmetric", False, "symmetric"), ("actorder", "group", "actorder"),
    ("strategy", "channel", "strategy"), ("group_size", 12, "group_size"),
])
def test_unsupported_schemes_raise(tmp_path, field, value, match):
    cfg = ModelConfig.from_name("tiny", dtype="bfloat16", expert_quant="int4")
    model = materialize(Transformer, cfg, "cpu", seed=1)
    q = quantization_config(32)
    q["config_groups"]["group_0"]["weights"][field] = value
    write_kimi_checkpoint(tmp_path, hf_state_dict(model), config={"quantization_config": q})
    with pytest.raises(ValueError, match=match):
        load_checkpoint(model, tmp_path)


def test_format_mismatches_raise(tmp_path):
    cfg = ModelConfig.from_name("tiny", dtype="bfloat16", expert_quant="int4")
    model = materialize(Transformer, cfg, "cpu", seed=1)
    write_kimi_checkpoint(tmp_path, hf_state_dict(model), config={"model_type": "kimi_k2"})  # no quantization_config
    with pytest.raises(ValueError, match="quantization_config"):
        load_checkpoint(model, tmp_path)
    (tmp_path / "w8a8").mkdir()
    q = quantization_config(32)
    q["config_groups"]["group_0"]["input_activations"] = {"num_bits": 8}
    write_kimi_checkpoint(tmp_path / "w8a8", hf_state_dict(model), config={"quantization_config": q})
    with pytest.raises(ValueError, match="input_activations"):
        load_checkpoint(model, tmp_path / "w8a8")
    (tmp_path / "dense").mkdir()
    dense = materialize(Transformer, ModelConfig.from_name("tiny", dtype="bfloat16"), "cpu", seed=1)
    write_kimi_checkpoint(tmp_path / "dense", hf_state_dict(dense), config={})
    with pytest.raises(ValueError, match="path"):
        load_checkpoint(model, tmp_path / "dense")


# ---------------------------------------------------------------------------- expert paths on INT4


class Load:
    group = None

    def count_experts(self, local, valid):
        pass


def test_int4_expert_paths_agree_with_the_dequantized_dense_module():
    cfg = ModelConfig.from_name("tiny", dtype="float32", expert_quant="int4")
    moe = materialize(MoE, cfg, "cpu", seed=2)
    dense = materialize(MoE, ModelConfig.from_name("tiny", dtype="float32"), "cpu", seed=9)
    dense.load_state_dict({k: v for k, v in moe.state_dict().items() if "experts_" not in k}, strict=False)
    gate_up, down = moe.dequantized(dtype=torch.float32)
    dense.experts_gate_up.data.copy_(gate_up)
    dense.experts_down.data.copy_(down)
    x = torch.randn(2, 7, cfg.hidden)
    ref = dense(x, Load())
    for impl in ("loop", "dense", "grouped_mm"):
        moe.impl = impl
        out = moe(x, Load())
        assert float((out - ref).norm() / ref.norm()) < 1e-5, impl
    with pytest.raises(ValueError, match="impl"):
        dense.impl = "w4a16"
        dense(x, Load())


# ---------------------------------------------------------------------------- routing policies


def draws(routing: str, n_experts=384, k=8, tokens=4096, calls=4, seed=0):
    cfg = ModelConfig.from_name("tiny", n_experts=n_experts, top_k=k, routing=routing, tp_size=1)
    moe = materialize(MoE, cfg, "cpu", seed=seed)
    x = torch.randn(tokens, cfg.hidden)
    from kdengine.engine.moe import route

    return torch.cat([route(x, moe)[0] for _ in range(calls)]), moe


def test_uniform_routing_is_uniform_and_distinct():
    ids, _ = draws("uniform")
    assert all(len(set(row)) == 8 for row in ids[:200].tolist())
    load = torch.bincount(ids.flatten(), minlength=384).float()
    expect = ids.numel() / 384  # ~341 per expert
    assert float(((load - expect) ** 2 / expect).sum()) < 384 + 6 * (2 * 384) ** 0.5  # chi-square, 383 dof
    assert float(load.max() / load.mean()) < 1.35


@pytest.mark.parametrize("imbalance", [2.0, 6.0])
def test_skewed_routing_hits_the_stated_imbalance(imbalance):
    ids, moe = draws(f"skewed:{imbalance}", calls=2)
    load = torch.bincount(ids.flatten(), minlength=384).float()
    hottest = int(moe.log_p.argmax())
    assert float(load[hottest] / load.mean()) == pytest.approx(imbalance, rel=0.12)
    assert all(len(set(row)) == 8 for row in ids[:200].tolist())


def test_routing_is_reproducible_and_moves_between_calls():
    a, _ = draws("uniform", tokens=64, calls=3, seed=1)
    b, _ = draws("uniform", tokens=64, calls=3, seed=1)
    assert torch.equal(a, b)
    assert not torch.equal(a[:64], a[64:128])
    u = hash_uniform(torch.tensor(3), torch.tensor(1), 64, 384)
    assert float(u.min()) > 0 and float(u.max()) < 1 and abs(float(u.mean()) - 0.5) < 0.01


def test_bad_routing_raises():
    assert parse_routing("skewed") == ("skewed", 2.0) and parse_routing("uniform") == ("uniform", 1.0)
    for bad in ("zipf", "uniform:2", "skewed:x", "skewed:0.5"):
        with pytest.raises(ValueError, match="routing"):
            parse_routing(bad)
    with pytest.raises(ValueError, match="routing"):
        ModelConfig.from_name("tiny", routing="skewed:5")  # 8 experts, top-2: at most 4


# ---------------------------------------------------------------------------- lossless with INT4


def test_speculative_equals_plain_greedy_with_int4_experts():
    from kdengine.engine.generate import generate_plain, generate_speculative, prefill, setup_engine

    cfg = ModelConfig.from_name("tiny", dtype="float64", expert_quant="int4")
    prompt = torch.randint(0, cfg.vocab_size, (2, 9), generator=torch.Generator().manual_seed(11))
    plain = setup_engine(cfg, "cpu", 2, 256, backend="reference", seed=7)
    assert plain.model.layers[1].mlp.int4
    prefill(plain, prompt)
    reference = generate_plain(plain, 14)
    spec = setup_engine(cfg, "cpu", 2, 256, backend="reference", seed=7)
    prefill(spec, prompt)
    assert generate_speculative(spec, 14, 15) == reference
