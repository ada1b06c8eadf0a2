"""Tensor parallel on the CPU with gloo: two processes, each with half the heads, experts, MLP columns
and vocab (loaded from one checkpoint), produce exactly the tokens of the one-process model."""

from __future__ import annotations

import json

import pytest
import torch
import torch.multiprocessing as mp

from kdengine.engine.config import ModelConfig
from kdengine.engine.generate import generate_speculative, prefill, setup_engine
from kdengine.engine.model import Transformer
from kdengine.engine.weights import hf_state_dict, load_checkpoint, materialize

pytestmark = pytest.mark.distributed
N_TOKENS, BUDGET, SEED = 14, 15, 3


def decode(cfg: ModelConfig, ckpt, group=None) -> list[list[int]]:
    engine = setup_engine(cfg, "cpu", 1, 256, backend="reference", seed=SEED, group=group)
    load_checkpoint(engine.model, ckpt)
    prompt = torch.randint(0, cfg.vocab_size, (1, 9), generator=torch.Generator().manual_seed(SEED))
    prefill(engine, prompt)
    return generate_speculative(engine, N_TOKENS, BUDGET)


def worker(rank: int, world: int, init: str, ckpt: str, out: str) -> None:
    from kdengine.engine.parallel import init_tp, rank_config

    torch.set_num_threads(1)
    group = init_tp("gloo", init, rank, world)
    cfg = rank_config(ModelConfig.from_name("tiny", dtype="float64"), group)
    tokens = decode(cfg, ckpt, group)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(tokens, f)
    torch.distributed.destroy_process_group()


def test_tp2_equals_tp1(tmp_path):
    from safetensors.torch import save_file

    cfg = ModelConfig.from_name("tiny", dtype="float64")
    save_file(hf_state_dict(materialize(Transformer, cfg, "cpu", seed=11)), str(tmp_path / "model.safetensors"))
    expected = decode(cfg, tmp_path)
    out = str(tmp_path / "tokens")
    mp.spawn(worker, args=(2, f"file://{tmp_path / 'rendezvous'}", str(tmp_path), out), nprocs=2, join=True)
    for rank in range(2):
        assert json.loads((tmp_path / f"tokens.{rank}").read_text()) == expected


def decode_worker(rank: int, world: int, init: str, out: str) -> None:
    from kdengine.engine.generate import DecodeSettings, run_decode
    from kdengine.engine.parallel import init_tp

    torch.set_num_threads(1)
    init_tp("gloo", init, rank, world)
    s = DecodeSettings(config="tiny", device="cpu", context=128, steps=3, warmup_steps=1, budget=7, tp=world)
    r = run_decode(s)
    with open(f"{out}.{rank}", "w") as f:
        json.dump(r.to_dict(), f, default=str)
    torch.distributed.destroy_process_group()


def test_run_decode_tp2_reports_every_rank(tmp_path):
    out = str(tmp_path / "result")
    mp.spawn(decode_worker, args=(2, f"file://{tmp_path / 'rendezvous'}", out), nprocs=2, join=True)
    results = [json.loads((tmp_path / f"result.{rank}").read_text()) for rank in range(2)]
    assert results[0]["tokens_per_step"] == results[1]["tokens_per_step"]
    for r in results:
        assert [x["rank"] for x in r["per_rank"]] == [0, 1]
        assert all(len(x["moe_load"]) == 4 for x in r["per_rank"])  # 8 experts over 2 ranks
        assert r["moe_rank_imbalance"] >= 1.0
