"""`kdengine decode`: measure speculative decoding tok/s on a synthetic context and print tok/s, mean
accepted length, step time and the per-phase breakdown (rich table, progress bar); --json writes the
same numbers."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

HELP = """Speculative decode benchmark: DFlash-style drafter, DDTree tree of `budget` nodes, target verify
(MLA via verify_attention + MoE) over a synthetic context whose KV pages are filled with random latent
rows (no prefill forward). tok/s counts accepted + bonus tokens per second for the --layers layers
actually run (default 8 for kimi-k2-tp8-rank, 3 for tiny); it is never extrapolated to the full
61-layer model. With random weights the acceptance is replayed (--acceptance replay, seeded, mean
--mean-accept tokens per step, full verify cost paid); the policy is printed with every result."""


def add_parser(sub) -> None:
    p = sub.add_parser("decode", help="speculative decode tok/s at a context length", description=HELP)
    p.add_argument("--config", default="kimi-k2-tp8-rank", help="model config: kimi-k2-tp8-rank or tiny")
    p.add_argument("--layers", type=int, default=None, help="layers to run and report (config default: 8 / 3)")
    p.add_argument("--context", type=int, default=65536, help="synthetic committed context per sequence")
    p.add_argument("--budget", type=int, default=63, help="draft tree nodes besides the root (T = budget+1)")
    p.add_argument("--backend", default="auto", help="verify backend: auto, cuda, triton, triton_extend, reference")
    p.add_argument("--steps", type=int, default=64, help="timed decode steps")
    p.add_argument("--warmup-steps", type=int, default=4)
    p.add_argument("--device", default="auto", help="auto (cuda if available), cuda or cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--acceptance", default="replay", choices=("replay", "greedy"))
    p.add_argument("--mean-accept", type=float, default=5.0, help="replay: mean tokens per step")
    p.add_argument("--no-cuda-graphs", action="store_true", help="run verify and drafter eagerly")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument(
        "--tp", type=int, default=1,
        help="tensor-parallel processes; > 1 outside torchrun relaunches this command under torchrun with N "
        "processes (nccl on cuda, gloo on cpu, NVLink multicast off); rank 0 prints, with every rank's phases, "
        "expert load and all-reduce share",
    )
    p.add_argument("--weights", default="dense", choices=("dense", "int4"),
                   help="routed experts: dense (config dtype, bf16 for kimi) or int4 (random INT4, group 32, W4A16 kernel)")
    p.add_argument("--routing", default="random",
                   help="MoE routing: random (the router), uniform (top-k uniform over all experts), skewed[:imbalance]")
    p.add_argument("--json", type=Path, default=None, help="also write the result as JSON here")
    p.set_defaults(func=run, decode_parser=p)


def settings_from(args):
    from kdengine.engine.generate import DecodeSettings

    return DecodeSettings(
        config=args.config, layers=args.layers, context=args.context, budget=args.budget, backend=args.backend,
        steps=args.steps, warmup_steps=args.warmup_steps, device=args.device, seed=args.seed,
        acceptance=args.acceptance, mean_accept=args.mean_accept, cuda_graphs=not args.no_cuda_graphs,
        batch=args.batch, tp=args.tp, weights=args.weights, routing=args.routing,
    )


def run(args) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from kdengine.engine.generate import run_decode

    settings = settings_from(args)
    if settings.tp > 1:
        from kdengine.engine import parallel

        if not parallel.under_launcher():
            return parallel.relaunch(settings.tp, parallel.argv_from(args, args.decode_parser))
        group, _ = parallel.join_group(settings.tp, settings.device)
    console = Console()
    lead = settings.tp == 1 or torch_rank(group) == 0
    with Progress(console=console, transient=True, disable=not lead) as bar:
        task = bar.add_task("decode steps", total=settings.warmup_steps + settings.steps)
        result = run_decode(settings, progress=lambda step, total: bar.update(task, completed=step, total=total))
    if lead:
        print_result(console, result)
    if lead and args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(result.to_dict(), indent=2, default=str))
        console.print(f"wrote {args.json}")
    if settings.tp > 1:
        parallel.finish_tp()
    return 0


def torch_rank(group) -> int:
    import torch.distributed as dist

    return dist.get_rank(group)


def print_result(console, r) -> None:
    from rich.table import Table

    d = r.to_dict()
    s = r.settings
    head = Table(title=f"kdengine decode: {s.config}, {r.layers} layers run (tok/s for these layers only)")
    head.add_column("metric")
    head.add_column("value", justify="right")
    for key, value in (
        ("tok/s", f"{r.tok_per_s:.1f}"),
        ("mean accepted length (tokens/step)", f"{r.mean_accept:.2f}"),
        ("mean step time (ms)", f"{d['mean_step_ms']:.3f}"),
        ("acceptance policy", r.policy),
        ("context / budget (T)", f"{s.context} / {s.budget} ({s.budget + 1})"),
        ("verify backend", r.backend),
        ("device / cuda graphs", f"{r.device} / {r.cuda_graphs_used}"),
        ("MoE expert path", r.expert_impl),
        ("MoE imbalance (max/mean)", f"{r.moe_imbalance:.2f}"),
        ("MoE weights / routing", f"{s.weights} / {r.routing}"),
        ("MoE experts touched per step (per layer)", f"{r.experts_touched:.1f} ({r.moe.get('experts_touched_per_layer', 0):.1f})"),
        ("MoE bytes per step (MB) / share of step / GB/s",
         f"{r.moe.get('moe_bytes_per_step', 0) / 1e6:.1f} / {100 * r.moe.get('moe_share', 0):.1f}% / {r.moe.get('moe_gbps', 0):.0f}"),
        ("peak GPU memory (GiB)", f"{r.peak_mem_gib:.1f}"),
        ("step memory floor (ms) / step over floor", f"{r.floor_ms:.3f} / {d['step_over_floor']:.2f}x"),
        ("bytes per step (MB)", ", ".join(f"{k} {v / 1e6:.1f}" for k, v in r.step_bytes.items())),
    ):
        head.add_row(key, value)
    console.print(head)
    phases = Table(title="phase breakdown (mean ms per step)")
    phases.add_column("phase")
    phases.add_column("ms", justify="right")
    phases.add_column("% of step", justify="right")
    step_ms = max(d["mean_step_ms"], 1e-12)
    for name, ms in r.phase_ms.items():
        phases.add_row(name, f"{ms:.3f}", f"{100 * ms / step_ms:.1f}")
    for name, ms in r.op_ms.items():  # the ops of "other"
        phases.add_row(f"  other/{name}", f"{ms:.3f}", f"{100 * ms / step_ms:.1f}")
    console.print(phases)
    if r.per_rank:
        print_ranks(console, r)
    for note in r.notes:
        console.print(f"note: {note}")


def print_ranks(console, r) -> None:
    from rich.table import Table

    imb = ", ".join(f"{k} {v:.2f}" for k, v in r.rank_imbalance.items())
    table = Table(title=f"per rank (imbalance across ranks, max/mean: {imb})")
    for col in ("rank", "tok/s", "verify-attention ms", "verify-moe ms", "other ms", "all-reduce ms", "all-reduce % of step",
                "tokens to experts/step", "MoE imbalance"):
        table.add_column(col, justify="right")
    for x in r.per_rank:
        ph = x["phase_ms"]
        table.add_row(
            str(x["rank"]), f"{x['tok_per_s']:.1f}", f"{ph['verify-attention']:.3f}", f"{ph['verify-moe']:.3f}",
            f"{ph['other']:.3f}", f"{x['all_reduce_ms']:.3f}", f"{100 * x['all_reduce_share']:.1f}",
            f"{sum(x['moe_load']):.1f}", f"{x['moe_imbalance']:.2f}",
        )
    console.print(table)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="kdengine")
    add_parser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["decode", *(argv or [])])
    return args.func(args)
