"""The in-kernel timeline of the dispatched sm90 verify call (split kernel + merge, as `kdengine.bench.kernel measure
--set merge` times it) in a CUDA graph: where the merge's ~3.5 us go (the wait release after the last split block,
the merge blocks' dispatch, their loads, their tail). Builds nothing: the timeline build must exist first.

    python -m kdengine.ops.build --arch native --timeline && python ci/gpu/timeline.py

With --path mma: the mma.sync default layout's call (its lean split kernel marks start, trigger and end too).
For each size: inputs and the call from kdengine.bench.kernel (launcher "cuda_sm90_dispatched", auto NSPLIT), the
warm-up and capture of kdengine.bench.timer, a few replays, then per repeat: L2 flushed (as the timing does), records
reset, one replay, records read and summarised (kdengine.bench.timeline); --raw DIR also writes each repeat's records.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python ci/gpu/timeline.py", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default="65536:16,65536:64", help="N:T pairs (context tokens : tree tokens), B=1 H=8")
    p.add_argument("--replays", type=int, default=5, help="graph replays before the recorded ones")
    p.add_argument("--repeats", type=int, default=3, help="recorded replays per size (each summarised)")
    p.add_argument("--no-flush", action="store_true", help="keep L2 warm before a recorded replay")
    p.add_argument("--brief", action="store_true", help="print only the figures over the repeats, not each repeat's")
    p.add_argument("--raw", default=None, help="a folder to write each repeat's records to (.csv)")
    p.add_argument("--path", choices=("sm90", "mma"), default="sm90",
                   help="the split kernel: the dispatched sm90 call (default) or the mma.sync default layout")
    p.add_argument("--combine", type=int, default=None,
                   help="the merge (kdengine.ops.cuda_backend.COMBINES; default: the path's own: SM90_COMBINE, DEFAULT_COMBINE on mma)")
    return p.parse_args(argv)


def timeline_build_missing() -> str | None:
    """None when the timeline build of the remembered arch is on disk, else the command that makes it."""
    from kdengine.ops import build

    name = build.extension_name(build.resolve_archs(build.default_arch_spec()), False, True)
    if (build.build_dir(name) / f"{name}.so").exists():
        return None
    return f"no timeline build {name}: run `python -m kdengine.ops.build --arch native --timeline` first"


def record_size(N: int, T: int, args) -> None:
    import torch

    from kdengine.bench import kernel, timeline, timer, verify_timing
    from kdengine.ops import cuda_backend

    inp, bits = verify_timing.make_inputs(N=N, T=T, H=kernel.H, seed=0, device="cuda")
    if args.path == "mma":  # the mma.sync default layout, with --combine's merge if given
        name, layout = "cuda", kernel.mma_layout(combine=args.combine)
    else:
        name, layout = "cuda_sm90_dispatched", ({} if args.combine is None else {"combine": args.combine})
    call, splits, _ = kernel.launcher(name, inp, bits, "auto", layout=layout)
    merge = (" mma.sync" if args.path == "mma" else "") + ("" if args.combine is None else f" combine={args.combine}")
    tag = ("_mma" if args.path == "mma" else "") + ("" if args.combine is None else f"_c{args.combine}")
    graph = timer._capture(lambda i: call(), 1, inp.q.device)  # the timer's own warm-up and capture
    if graph is None:
        raise RuntimeError("the call could not be captured in a CUDA graph")
    for _ in range(args.replays):
        graph.replay()
    flush = None if args.no_flush else timer.l2_flush_buffer(inp.q.device)
    summaries = []
    for rep in range(args.repeats):
        if flush is not None:
            flush.zero_()
        cuda_backend.timeline_reset()
        graph.replay()
        records = cuda_backend.timeline_read()
        if args.raw:
            out = Path(args.raw) / f"timeline_{N}_T{T}{tag}_{rep}.csv"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text("kind,block,smid,t_ns\n" + "".join(",".join(map(str, r)) + "\n" for r in records.tolist()))
        summaries.append(timeline.summarize(records.tolist()))
        if not args.brief:
            title = f"ctx{N} T{T} nsplit={splits}{merge} repeat {rep}:"
            print(timeline.format_summary(summaries[-1], title), flush=True)
    print(timeline.format_aggregate(summaries, f"ctx{N} T{T} nsplit={splits}{merge}"), flush=True)
    torch.cuda.synchronize()


def main(argv=None) -> int:
    args = parse_args(argv)
    from kdengine import env

    os.environ.setdefault(env.TIMELINE_VAR, "1")  # the cuda backend then loads the timeline build
    missing = timeline_build_missing()
    if missing:
        print(missing, file=sys.stderr)
        return 2
    for size in args.sizes.split(","):
        N, T = (int(v) for v in size.split(":"))
        record_size(N, T, args)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
