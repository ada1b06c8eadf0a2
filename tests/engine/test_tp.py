"""Tensor and expert parallelism on the CPU with gloo. Two processes holding half the heads, experts,
MLP columns and vocab of one checkpoint decode exactly the tokens of the one-process model (greedy,
real acceptance, float64 weights), their gathered logit shards match its logits, and every rank
accepts the same tokens at every step. `kdengine decode --tp N` relaunches itself under torchrun
(N = 2 on tiny, N = 8 on tiny-tp8) and reports every rank's phases, MoE load and all-reduce share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from kdengine.cli import build_parser
from kdengine.engine import parallel
from kdengine.engine.accept import accepted_tokens
from kdengine.engine.config import ModelConfig
from kdengine.engine.generate import (
    fill_synthetic_context,
    generate_plain,
    prefill,
    setup_engine,
    speculative_step,
)
from kdengine.engine.model import Transformer
from kdengine.engine.weights import hf_state_dict, load_checkpoint, materialize
from tests.engine.test_lossless import oracle_drafter

pytestmark = pytest.mark.distributed
N_TOKENS, BUDGET, SEED, PROMPT = 16, 11, 5, 13
REPO = Path(__file__).resolve().parents[2]

# ---------------------------------------------------------------------------- launch helpers


def test_argv_from_parses_back_to_the_same_decode_options():
    parser = build_parser()
    args = parser.parse_args(["decode", "--tp", "2", "--device", "cpu", "--config", "tiny", "--steps", "3",
                              "--no-cuda-graphs", "--mean-accept", "2.5", "--json", "/tmp/out/r.json"])
    argv = parallel.argv_from(args, args.decode_parser)
    assert argv[0] == "decode" and "--tp" in argv and "--no-cuda-graphs" in argv
    again = parser.parse_args(argv)
    skip = {"func", "decode_parser"}
    assert {k: v for k, v in vars(again).items() if k not in skip} == {k: v for k, v in vars(args).items() if k not in skip}


def test_launch_turns_nvlink_multicast_off_and_runs_the_cli_module():
    env = parallel.launch_env({"NCCL_NVLS_ENABLE": "1", "PATH": "/bin"})
    assert env["PATH"] == "/bin"
    assert {k: env[k] for k in parallel.NVLS_OFF} == {
        "NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
    cmd = parallel.torchrun_command(8, ["decode", "--tp", "8"])
    assert cmd[1:3] == ["-m", "torch.distributed.run"] and "--nproc-per-node=8" in cmd
    assert cmd[-5:] == ["-m", "kdengine.cli", "decode", "--tp", "8"]
    with pytest.raises(ValueError, match="nproc"):
        parallel.torchrun_command(0, [])
    assert parallel.backend_for("cpu") == "gloo" and parallel.backend_for("cuda:1") == "nccl"


def test_summarize_ranks_reports_max_over_mean():
    ranks = [
        {"moe_load": [3.0, 1.0], "phase_ms": {"verify-moe": 2.0, "verify-attention": 1.0}, "all_reduce_ms": 1.0},
        {"moe_load": [0.0, 0.0], "phase_ms": {"verify-moe": 1.0, "verify-attention": 1.0}, "all_reduce_ms": 3.0},
    ]
    s = parallel.summarize_ranks(ranks)
    assert s == pytest.approx({"moe_tokens": 2.0, "moe_ms": 4 / 3, "attention_ms": 1.0, "all_reduce_ms": 1.5})
    assert parallel.imbalance([]) == 0.0 and parallel.imbalance([0.0, 0.0]) == 0.0


def test_tp8_config_divides_by_eight():
    cfg = ModelConfig.from_name("tiny-tp8", tp_size=8, tp_rank=7)
    assert (cfg.local_heads, cfg.local_experts, cfg.local_vocab) == (1, 2, 12)
    with pytest.raises(ValueError, match="n_heads"):
        ModelConfig.from_name("tiny", tp_size=8)


# ---------------------------------------------------------------------------- TP=2 vs TP=1


def prompt() -> torch.Tensor:
    return torch.randint(0, 96, (1, PROMPT), generator=torch.Generator().manual_seed(SEED))


def plain_reference(cfg: ModelConfig, ckpt) -> list[int]:
    """Plain greedy decoding of the one-process model: the lossless reference."""
    engine = setup_engine(cfg, "cpu", 1, 256, backend="reference", seed=SEED)
    load_checkpoint(engine.model, ckpt)
    prefill(engine, prompt())
    return generate_plain(engine, N_TOKENS)[0]


def decode_and_record(cfg: ModelConfig, ckpt, reference: list[int], group=None) -> dict:
    """Greedy speculative decode (real tree walk; an oracle drafter that often ranks the reference
    continuation among its candidates, so steps accept several tokens); the tokens, each step's
    accept decision and the LM head output (this rank's vocab shard) of every target forward."""
    engine = setup_engine(cfg, "cpu", 1, 256, backend="reference", seed=SEED, group=group)
    load_checkpoint(engine.model, ckpt)
    engine.draft_fn = oracle_drafter([reference], PROMPT, SEED)
    logits: list[torch.Tensor] = []
    engine.model.lm_head.register_forward_hook(lambda _m, _i, out: logits.append(out.detach().clone()))
    prefill(engine, prompt())
    tokens, steps = engine.root.tolist(), []
    while len(tokens) < N_TOKENS:
        path, count, bonus, tree_tokens, _ = speculative_step(engine, BUDGET)
        parallel.check_replicated(group, path=path, count=count, bonus=bonus, tree=tree_tokens)
        steps.append((path.tolist(), count.tolist(), bonus.tolist()))
        tokens.extend(accepted_tokens(tree_tokens, path, count, bonus)[0])
    return {"tokens": tokens[:N_TOKENS], "steps": steps, "logits": logits}


def rank_config_steps(group) -> dict:
    """The path of kimi-k2-tp8-rank on 2 GPUs, scaled down: a config with tp_size 8 run by 2
    processes keeps its per-rank shapes (ranks 0 and 1 of 8) and all-reduces over the 2."""
    cfg = parallel.rank_config(ModelConfig.from_name("tiny-tp8", tp_size=8), group)
    engine = setup_engine(cfg, "cpu", 1, 512, backend="reference", seed=SEED, group=group)
    fill_synthetic_context(engine, 300, SEED)
    seen = {}
    engine.model.layers[0].self_attn.q_b_proj.register_forward_hook(lambda _m, _i, out: seen.update(q=out.shape))
    emitted = []
    for _ in range(3):
        path, count, bonus, tree_tokens, _ = speculative_step(engine, 7)
        parallel.check_replicated(group, path=path, count=count, bonus=bonus, tree=tree_tokens)
        emitted.append(accepted_tokens(tree_tokens, path, count, bonus)[0])
    return {"tp": (cfg.tp_rank, cfg.tp_size), "q_width": seen["q"][-1], "heads": cfg.local_heads, "tokens": emitted}


def tp_worker(rank: int, world: int, init: str, ckpt: str, reference: list[int], out: str) -> None:
    torch.set_num_threads(1)
    group = parallel.init_tp("gloo", init, rank, world)
    cfg = parallel.rank_config(ModelConfig.from_name("tiny", dtype="float64"), group)
    record = decode_and_record(cfg, ckpt, reference, group)
    record["rank_config"] = rank_config_steps(group)
    try:  # the replication check must fire, on every rank, when the ranks disagree
        parallel.check_replicated(group, rank=torch.tensor([rank]))
        record["mismatch_caught"] = False
    except RuntimeError:
        record["mismatch_caught"] = True
    torch.save(record, f"{out}.{rank}")
    parallel.finish_tp()


def test_tp2_tokens_logits_and_acceptance_equal_tp1(tmp_path):
    from safetensors.torch import save_file

    cfg = ModelConfig.from_name("tiny", dtype="float64")
    save_file(hf_state_dict(materialize(Transformer, cfg, "cpu", seed=17)), str(tmp_path / "model.safetensors"))
    reference = plain_reference(cfg, tmp_path)
    single = decode_and_record(cfg, tmp_path, reference)
    assert single["tokens"] == reference
    out = str(tmp_path / "rank")
    init = f"file://{tmp_path / 'rendezvous'}"
    mp.spawn(tp_worker, args=(2, init, str(tmp_path), reference, out), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    assert len(single["steps"]) < N_TOKENS - 1  # some steps accepted more than the bonus token
    for r in ranks:
        assert r["tokens"] == single["tokens"]
        assert r["steps"] == single["steps"]
        assert r["mismatch_caught"]
    assert len(ranks[0]["logits"]) == len(single["logits"])
    q_head = ModelConfig.from_name("tiny-tp8").q_head
    for rank, r in enumerate(ranks):  # a tp_size-8 config on 2 processes: ranks 0 and 1 of 8, 1 head each
        assert r["rank_config"]["tp"] == (rank, 8) and r["rank_config"]["q_width"] == r["rank_config"]["heads"] * q_head == q_head
    assert ranks[0]["rank_config"]["tokens"] == ranks[1]["rank_config"]["tokens"]
    for i, full in enumerate(single["logits"]):
        shards = [r["logits"][i] for r in ranks]
        assert all(s.shape[-1] == cfg.vocab_size // 2 for s in shards)
        # float64 everywhere but verify attention (bf16): the sums in a different order flip a few
        # bf16 roundings, which moves logits by ~1e-4 of their scale
        torch.testing.assert_close(torch.cat(shards, -1), full, rtol=0, atol=1e-3 * full.abs().max().item())


# ---------------------------------------------------------------------------- the CLI launch path


def run_cli(tmp_path, tp: int, config: str, *extra: str) -> dict:
    out = tmp_path / "out" / f"tp{tp}.json"
    cmd = [sys.executable, "-m", "kdengine.cli", "decode", "--tp", str(tp), "--device", "cpu", "--config", config,
           "--steps", "3", "--warmup-steps", "1", "--context", "128", "--budget", "7", "--json", str(out), *extra]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "NCCL_NVLS_ENABLE=0" in proc.stderr and "torch.distributed.run" in proc.stderr
    return json.loads(out.read_text())


def check_report(r: dict, tp: int, local_experts: int) -> None:
    assert [x["rank"] for x in r["per_rank"]] == list(range(tp))
    for x in r["per_rank"]:
        assert len(x["moe_load"]) == local_experts
        assert 0.0 < x["all_reduce_share"] < 1.0
        assert x["all_reduce_ms"] < x["step_ms"]
    assert set(r["rank_imbalance"]) == {"moe_tokens", "moe_ms", "attention_ms", "all_reduce_ms"}
    assert all(v >= 1.0 for v in r["rank_imbalance"].values())
    assert r["moe_rank_imbalance"] == r["rank_imbalance"]["moe_tokens"]
    assert len(r["tokens_per_step"]) == 3 and r["tok_per_s"] > 0


def test_cli_decode_tp2_relaunches_under_torchrun(tmp_path):
    r = run_cli(tmp_path, 2, "tiny")
    check_report(r, 2, local_experts=4)
    # the TP benchmark case turns the same JSON into a samples record
    from benchmarks import bench_tp

    rec = bench_tp.record_from(r, bench_tp.workload_name(2, "cuda", 4096), 2, (2, "cuda", 4096), ({}, {}))
    assert rec["name"] == "decode-tp2/cuda/ctx4096" and rec["unit"] == "tok/s" and rec["direction"] == "higher"
    assert len(rec["samples"]) == 3 and min(rec["samples"]) <= rec["median"] <= max(rec["samples"])
    assert rec["extra"]["all_reduce_share"] == r["all_reduce_share"] and rec["fingerprint"]["gpus"] == 2
    assert "tok/s, all-reduce" in bench_tp.summary_line(rec)


@pytest.mark.skipif(torch.cuda.device_count() >= 8, reason="this machine has the GPUs: the case runs")
def test_tp_benchmark_case_is_skipped_without_the_gpus(tmp_path):
    from benchmarks import bench_tp

    with pytest.raises(NotImplementedError, match="decode-tp8/cuda/ctx65536: needs 8 CUDA GPUs"):
        bench_tp.TPDecode().setup(8, "cuda", 65536)
    assert bench_tp.main(["--tp", "8", "--out", str(tmp_path)]) == 2  # nothing could run here
    cmd = bench_tp.decode_command(2, "triton", 16384, 64, Path("/tmp/x.json"))
    assert cmd[cmd.index("--tp") + 1] == "2" and cmd[cmd.index("--config") + 1] == "kimi-k2-tp8-rank"


@pytest.mark.slow
def test_cli_decode_tp8_launch_path(tmp_path):
    """Eight gloo ranks of tiny-tp8 (1 head, 2 experts each) with real greedy acceptance: run_decode
    raises unless every rank committed the same tokens."""
    r = run_cli(tmp_path, 8, "tiny-tp8", "--acceptance", "greedy", "--layers", "2")
    check_report(r, 8, local_experts=2)
    assert r["policy"] == "greedy"


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_cli_decode_tp2_over_nccl_one_gpu_per_rank(tmp_path):
    """The GPU launch path: NCCL, rank r on cuda:r, real greedy acceptance replicated on both ranks."""
    r = run_cli(tmp_path, 2, "tiny", "--device", "cuda", "--acceptance", "greedy")
    check_report(r, 2, local_experts=4)
    assert [x["device"] for x in r["per_rank"]] == ["cuda:0", "cuda:1"]
    assert all(x["peak_mem_gib"] > 0 for x in r["per_rank"])


def graph_tp_worker(rank: int, world: int, init: str, out: str) -> None:
    """One NCCL rank: greedy speculative tokens of a bf16 tiny model, eager then with the drafter,
    tree and verify captured in CUDA graphs (the verify graph holds the all-reduces and the LM
    head's all-gather)."""
    from kdengine.engine.graphs import choose_expert_impl
    from kdengine.engine.step import capture_graphs, generate_speculative

    os.environ.update(parallel.NVLS_OFF)
    torch.cuda.set_device(rank)
    group = parallel.init_tp("nccl", init, rank, world)
    cfg = parallel.rank_config(ModelConfig.from_name("tiny", dtype="bfloat16"), group)
    tokens, notes = [], []
    for graphs in (False, True):
        engine = setup_engine(cfg, "cuda", 2, 512, backend="triton", seed=SEED, group=group)
        engine.model.set_expert_impl(choose_expert_impl(cfg, torch.device("cuda")))
        prefill(engine, torch.randint(0, cfg.vocab_size, (2, 40), generator=torch.Generator().manual_seed(SEED)))
        captured = capture_graphs(engine, 31, notes) if graphs else False
        tokens.append(generate_speculative(engine, 40, 31))
        parallel.check_replicated(group, root=engine.root, lengths=engine.cache.lengths)
    torch.save({"tokens": tokens, "captured": captured, "notes": notes}, f"{out}.{rank}")
    parallel.finish_tp()


@pytest.mark.gpu
@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs 2 CUDA GPUs")
def test_tp2_graph_replay_gives_eager_tokens_over_nccl(tmp_path):
    out = str(tmp_path / "rank")
    mp.spawn(graph_tp_worker, args=(2, f"file://{tmp_path / 'rendezvous'}", out), nprocs=2, join=True)
    ranks = [torch.load(f"{out}.{r}") for r in range(2)]
    for r in ranks:
        assert r["captured"], r["notes"]
        assert r["tokens"][0] == r["tokens"][1]
    assert ranks[0]["tokens"] == ranks[1]["tokens"]
