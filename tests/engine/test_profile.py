"""The decode profile: per-phase and per-op times that add up, the step roofline, attribution of a change
between two results, and the MLA glue it times (fused down-projection weight kept in step with loads)."""

from __future__ import annotations

import pytest
import torch

from kdengine.engine.config import ModelConfig
from kdengine.engine.generate import DecodeSettings, run_decode
from kdengine.engine.model import MLA, apply_rope, rope_frequencies, rope_tables
from kdengine.engine.profiler import OTHER_OPS, OTHER_REST, PHASES, attribute


@pytest.fixture(scope="module")
def tiny_result():
    s = DecodeSettings(config="tiny", device="cpu", context=200, steps=4, warmup_steps=1, budget=11, mean_accept=3.0)
    return run_decode(s)


def test_ops_split_other_and_add_up(tiny_result):
    r = tiny_result
    assert list(r.phase_ms) == list(PHASES)
    assert set(r.op_ms) <= {*OTHER_OPS, OTHER_REST} and OTHER_REST in r.op_ms
    for op in ("qkv-down-proj", "q-up-proj", "rope", "absorb-q", "absorb-o", "o-proj", "lm-head"):
        assert r.op_ms[op] > 0, op
    assert sum(r.op_ms.values()) == pytest.approx(r.phase_ms["other"], rel=1e-6, abs=1e-9)


def test_profile_carries_the_roofline(tiny_result):
    p = tiny_result.profile()
    assert {"phase_ms", "op_ms", "step_ms", "floor_ms", "step_over_floor", "step_bytes"} <= set(p)
    assert set(p["step_bytes"]) == {"weights", "experts", "kv", "drafter_weights", "drafter_kv"}
    cfg = ModelConfig.from_name("tiny")
    assert p["step_bytes"]["kv"] == cfg.n_layers * (200 + 12) * 576 * 2
    assert p["floor_ms"] > 0 and p["step_over_floor"] == pytest.approx(p["step_ms"] / p["floor_ms"])
    assert p["step_bytes"]["experts"] > 0  # some experts got tokens
    assert set(p["floor_ms_by_part"]) == set(p["step_bytes"])
    assert sum(p["floor_ms_by_part"].values()) == pytest.approx(p["floor_ms"])


def test_attribute_names_the_ops_that_moved():
    base = {"phase_ms": {"draft": 1.0, "tree": 0.5, "verify-moe": 2.0, "other": 3.0},
            "op_ms": {"rope": 1.0, "o-proj": 1.5, OTHER_REST: 0.5}}
    head = {"phase_ms": {"draft": 1.0, "tree": 0.1, "verify-moe": 2.3, "other": 4.0},
            "op_ms": {"rope": 2.0, "o-proj": 1.5, OTHER_REST: 0.5}}
    rows = attribute(base, head)
    assert rows[0]["op"] == "other/rope" and rows[0]["delta_ms"] == pytest.approx(1.0)
    assert [r["op"] for r in rows[1:3]] == ["tree", "verify-moe"]
    total = 1.0 - 0.4 + 0.3
    assert rows[0]["share_of_change"] == pytest.approx(1.0 / total)
    assert sum(r["share_of_change"] for r in rows) == pytest.approx(1.0)
    assert "other" not in {r["op"] for r in rows}  # replaced by its ops


def test_attribute_falls_back_to_phases_when_one_side_has_no_ops():
    base = {"phase_ms": {"draft": 1.0, "other": 3.0}}
    head = {"phase_ms": {"draft": 1.5, "other": 3.0}, "op_ms": {"rope": 2.0, OTHER_REST: 1.0}}
    rows = attribute(base, head)
    assert {r["op"] for r in rows} == {"draft", "other"}
    assert rows[0] == {"op": "draft", "base_ms": 1.0, "head_ms": 1.5, "delta_ms": 0.5, "share_of_change": 1.0}


def test_attribute_of_equal_results_is_all_zero():
    extra = {"phase_ms": {"draft": 1.0, "other": 2.0}, "op_ms": {"rope": 2.0}}
    assert all(r["delta_ms"] == 0 and r["share_of_change"] == 0 for r in attribute(extra, extra))


def test_fused_down_projection_follows_weight_loads():
    cfg = ModelConfig.from_name("tiny", dtype="float64")
    mla = MLA(cfg).double()
    gen = torch.Generator().manual_seed(3)
    for p in mla.parameters():
        p.data.copy_(torch.randn(p.shape, generator=gen, dtype=p.dtype))
    w = mla.down_weight()
    assert w is mla.down_weight()  # cached while the weights stay
    assert torch.equal(w, torch.cat([mla.q_a_proj.weight, mla.kv_a_proj_with_mqa.weight]))
    with torch.no_grad():
        mla.kv_a_proj_with_mqa.weight.copy_(torch.randn(mla.kv_a_proj_with_mqa.weight.shape, generator=gen, dtype=torch.float64))
    assert torch.equal(mla.down_weight()[cfg.q_lora_rank :], mla.kv_a_proj_with_mqa.weight)


def test_rope_with_shared_tables_equals_per_call_rope():
    cfg = ModelConfig.from_name("kimi-k2-tp8-rank")
    inv = rope_frequencies(cfg, "cpu")
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, 9, 64, generator=gen)
    pos = torch.randint(0, 70000, (2, 5), generator=gen)
    assert torch.equal(apply_rope(x, pos, inv), apply_rope(x, pos, inv, rope_tables(pos, inv)))
    # q heads and the key rotated in one call equal separate calls
    k = torch.randn(2, 5, 64, generator=gen)
    both = apply_rope(torch.cat([x, k[:, :, None]], 2), pos, inv)
    assert torch.equal(both[:, :, :9], apply_rope(x, pos, inv)) and torch.equal(both[:, :, 9], apply_rope(k, pos, inv))


def test_event_cost_comes_off_the_regions_that_hold_event_nodes():
    from kdengine.engine.profiler import corrected_ms, event_overhead_ms

    e = event_overhead_ms(profiled_ms=3.0, replayed_ms=2.0, pairs=100)  # 200 event nodes cost 1 ms
    assert e == pytest.approx(0.005)
    assert event_overhead_ms(2.0, 2.5, 100) == 0.0 and event_overhead_ms(3.0, 2.0, 0) == 0.0
    assert corrected_ms(0.100, 0, e) == pytest.approx(0.095)  # a leaf: its end event
    assert corrected_ms(0.300, 6, e) == pytest.approx(0.300 - 13 * e)  # a region holding 6 timed parts
    assert corrected_ms(0.001, 0, e) == 0.0  # never negative
