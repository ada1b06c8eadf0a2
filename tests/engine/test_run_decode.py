"""run_decode on the tiny config (CPU): the numbers, every phase and the policy are reported; the
`kdengine decode` CLI writes them as JSON. GPU: graph replay gives the same tokens as eager."""

from __future__ import annotations

import json

import pytest
import torch

from kdengine.cli import main
from kdengine.engine.generate import DecodeSettings, generate_speculative, prefill, run_decode, setup_engine
from kdengine.engine.profiler import PHASES


def test_run_decode_tiny_reports_everything():
    s = DecodeSettings(config="tiny", device="cpu", context=256, steps=6, warmup_steps=1, budget=15, mean_accept=4.0)
    r = run_decode(s)
    assert len(r.step_times_s) == 6 and all(t > 0 for t in r.step_times_s)
    assert len(r.tokens_per_step) == 6 and all(1 <= n <= 17 for n in r.tokens_per_step)
    assert r.tok_per_s == pytest.approx(sum(r.tokens_per_step) / sum(r.step_times_s))
    assert list(r.phase_ms) == list(PHASES) and r.phase_ms["verify-attention"] > 0
    assert r.phase_ms["verify-moe"] > 0 and r.phase_ms["draft"] > 0 and r.phase_ms["other"] > 0
    step_ms = 1e3 * sum(r.step_times_s) / len(r.step_times_s)
    assert sum(r.phase_ms.values()) == pytest.approx(step_ms, rel=0.25)  # the phases add up to the step
    assert len(r.moe_load) == 8 and r.moe_imbalance >= 1.0
    assert r.policy.startswith("replay(mean=4") and r.layers == 3 and r.backend == "reference"
    assert any("synthetic context" in n for n in r.notes)
    assert {"moe-route", "moe-shared", "moe-rest"} <= set(r.moe_op_ms)  # the loop path has no dispatch/combine parts
    assert sum(r.moe_op_ms.values()) == pytest.approx(r.phase_ms["verify-moe"], rel=1e-6)
    assert 0 < r.host_step_ms <= 1.5 * step_ms  # on the CPU the host time is the step
    d = r.to_dict()
    assert d["settings"]["context"] == 256 and d["mean_step_ms"] > 0


def test_run_decode_greedy_policy_and_progress():
    calls = []
    s = DecodeSettings(config="tiny", device="cpu", context=64, steps=3, warmup_steps=1, budget=7, acceptance="greedy")
    r = run_decode(s, progress=lambda step, total: calls.append((step, total)))
    assert r.policy == "greedy" and calls[-1] == (4, 4)


def test_bad_settings_raise():
    with pytest.raises(ValueError, match="acceptance"):
        run_decode(DecodeSettings(config="tiny", device="cpu", acceptance="magic"))
    with pytest.raises(ValueError, match="budget"):
        run_decode(DecodeSettings(config="tiny", device="cpu", context=64, budget=300))


def test_cli_decode_writes_json(tmp_path, capsys):
    path = tmp_path / "decode.json"
    rc = main(["decode", "--device", "cpu", "--config", "tiny", "--steps", "4", "--context", "128", "--json", str(path)])
    assert rc == 0
    data = json.loads(path.read_text())
    assert data["tok_per_s"] > 0 and len(data["step_times_s"]) == 4 and "verify-moe" in data["phase_ms"]
    assert "tok/s" in capsys.readouterr().out


@pytest.mark.gpu
def test_graph_replay_gives_eager_tokens():
    from kdengine.engine.config import ModelConfig
    from kdengine.engine.graphs import choose_expert_impl
    from kdengine.engine.step import capture_graphs
    from kdengine.ops.verify import available_backends

    backend = next((b for b in ("cuda", "triton") if b in available_backends("cuda")), None)
    if backend is None:
        pytest.skip("no graph-safe verify backend on this GPU")
    cfg = ModelConfig.from_name("tiny", dtype="bfloat16")
    prompt = torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(0))
    outs = []
    for graphs in (False, True):
        engine = setup_engine(cfg, "cuda", 2, 512, backend=backend, seed=0)
        engine.model.set_expert_impl(choose_expert_impl(cfg, torch.device("cuda")))
        prefill(engine, prompt)
        if graphs:
            assert capture_graphs(engine, 31, [])
        outs.append(generate_speculative(engine, 40, 31))
    assert outs[0] == outs[1]


@pytest.mark.gpu
def test_kimi_rank_decode_smoke_with_graphs():
    """Two layers of the real per-rank shapes at 4k: graphs captured, numbers finite, all phases timed."""
    s = DecodeSettings(config="kimi-k2-tp8-rank", layers=2, context=4096, steps=4, warmup_steps=1, device="cuda")
    r = run_decode(s)
    assert r.cuda_graphs_used, r.notes
    assert r.tok_per_s > 0 and all(t > 0 for t in r.step_times_s)
    assert r.phase_ms["verify-attention"] > 0 and r.phase_ms["verify-moe"] > 0 and len(r.moe_load) == 48
