"""Configs (Kimi scale, per-rank sizes, memory fit), acceptance walk and the replay policy, MoE paths."""

from __future__ import annotations

import math

import pytest
import torch

from kdengine.engine.accept import ReplayPolicy, accept_greedy, accept_replay
from kdengine.engine.config import ModelConfig, max_layers_that_fit, weight_bytes
from kdengine.engine.model import MoE
from kdengine.engine.weights import materialize


def test_kimi_rank_sizes_and_yarn_scale():
    cfg = ModelConfig.from_name("kimi-k2-tp8-rank")
    assert (cfg.local_heads, cfg.local_experts, cfg.local_vocab, cfg.n_layers) == (8, 48, 20480, 8)
    mscale = 0.1 * 1.0 * math.log(32) + 1
    assert cfg.sm_scale == pytest.approx(192**-0.5 * mscale**2, rel=1e-12)
    assert ModelConfig.from_name("tiny").sm_scale == pytest.approx(80**-0.5)


def test_memory_estimate_matches_hand_count():
    cfg = ModelConfig.from_name("kimi-k2-tp8-rank")
    experts = 48 * 3 * 7168 * 2048 * 2
    assert weight_bytes(cfg)["moe"] >= 7 * experts
    fit = max_layers_that_fit(cfg, 141 * 10**9, 65536)
    assert 20 < fit < 61  # the full model does not fit one GPU


def test_config_errors_name_the_field():
    with pytest.raises(ValueError, match="config"):
        ModelConfig.from_name("nope")
    with pytest.raises(ValueError, match="overrides"):
        ModelConfig.from_name("tiny", heads=3)
    with pytest.raises(ValueError, match="n_heads"):
        ModelConfig.from_name("tiny", tp_size=3)


def test_greedy_walk_stops_at_first_mismatch():
    # root 0 -> 1 (tok 5) -> 3 (tok 7); root -> 2 (tok 6); 1 -> 4 (tok 8)
    tokens = torch.tensor([[9, 5, 6, 7, 8]])
    parents = torch.tensor([[-1, 0, 0, 1, 1]])
    target = torch.tensor([[5, 8, 0, 4, 0]])  # after root: 5 (node 1), after node 1: 8 (node 4), after 4: 0
    path, count, bonus = accept_greedy(tokens, parents, target, max_depth=4)
    assert int(count[0]) == 3 and path[0, :3].tolist() == [0, 1, 4] and int(bonus[0]) == 0
    target = torch.tensor([[3, 8, 0, 4, 0]])  # no child of the root has token 3
    path, count, bonus = accept_greedy(tokens, parents, target, max_depth=4)
    assert int(count[0]) == 1 and int(bonus[0]) == 3


@pytest.mark.parametrize("mean", [1.0, 3.5, 5.0, 9.0])
def test_replay_policy_has_its_stated_mean(mean):
    policy = ReplayPolicy(mean=mean, seed=1, max_len=17)
    draws = [x for _ in range(4000) for x in policy.draw(1)]
    assert min(draws) >= 1 and max(draws) <= 17
    assert sum(draws) / len(draws) == pytest.approx(mean, abs=0.1)
    assert ReplayPolicy(mean=mean, seed=1).draw(8) == ReplayPolicy(mean=mean, seed=1).draw(8)
    assert "replay" in policy.name and f"{mean:g}" in policy.name
    with pytest.raises(ValueError, match="mean_accept"):
        ReplayPolicy(mean=0.5)


def test_replay_accept_keeps_leading_slots():
    target = torch.arange(10)[None] + 100
    path, count, bonus = accept_replay(target, [4], 10)
    assert int(count[0]) == 4 and int(bonus[0]) == 103 and path[0].tolist() == list(range(10))


def test_expert_paths_agree():
    cfg = ModelConfig.from_name("tiny", dtype="bfloat16")
    moe = materialize(MoE, cfg, "cpu", seed=2)
    x = torch.randn(2, 7, cfg.hidden).to(torch.bfloat16)

    class Load:
        def count_experts(self, local, valid):
            pass

        group = None

    outs = {}
    for impl in ("loop", "dense", "grouped_mm"):
        moe.impl = impl
        outs[impl] = moe(x, Load()).float()
    ref = outs["loop"]
    for impl in ("dense", "grouped_mm"):
        err = (outs[impl] - ref).norm() / ref.norm()
        assert err < 2e-2, impl
