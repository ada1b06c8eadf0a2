"""Merge 4 against merge 7 after the dispatched sm90 call, timed two ways, then in the decode engine.

In the sweep (kdengine.bench.verify_timing: K = 8 calls per CUDA-graph replay, back to back) merge 7 was 2.1-2.6 us
slower than 4 after the sm90 call at 65k T=64 (perf_history/kernel/spread2_0117714/), while the merge timeline (one
call per replay after the L2 flush) had its tail 0.4 us shorter. This times both merges A B B A with their samples
interleaved, at K = 8 (the sweep's form) and K = 1 (one call per replay), and then runs the decode engine (the cuda
backend, 8 layers, CUDA graphs) with each merge as the sm90 (or the mma.sync) path's, where each verify call is followed by
other kernels, not by the next split kernel. Prints one line per row and writes a JSON (--out).

    python3 ci/gpu/merge_ab.py --out merge_ab.json [--sizes 65536:64 65536:16] [--samples 40] [--decode 65536]
        [--decode-merges 4 7 7 4] [--paths sm90 mma] [--merges 7 8]

--merges A B: the two merges timed (cuda_backend.COMBINES; default 4 7), rows A B B A with the second A and B tagged /aa
(the ready merge's runs, perf_history/kernel/ready_6e467ca/, timed 7 against that probe's 8).
"""

from __future__ import annotations

import argparse

import torch

from ci.gpu import ab_common
from kdengine.bench import kernel, verify_timing


def time_size(N: int, T: int, samples: int, abba: tuple) -> dict:
    sets = verify_timing.input_sets(N=N, T=T, H=kernel.H, device="cuda")
    calls = [kernel.rotating_call("cuda_sm90_dispatched", "auto", layout={"combine": c})[0] for c, _ in abba]
    out = {}
    for form in (None, 1):  # the sweep's K, then one call per replay
        rows = verify_timing.time_verify_many([(c, sets) for c in calls], samples=samples, launches=form)
        for (c, tag), m in zip(abba, rows, strict=True):
            label = f"K{m.launches_per_sample}/c{c}{tag}"
            out[label] = {"median_us": m.median * 1e6, "samples_s": m.samples}
            print(f"ctx{N} T{T} {label:12s} {m.median * 1e6:8.2f} us", flush=True)
    return out


def decode(ctx: int, merges: tuple[int, ...], path: str) -> dict:
    """The decode engine at `ctx` once per merge in `merges` (in that order), each as `path`'s merge (its module value,
    read at every launch), the cuda backend on that path (KDENGINE_CUDA_PATH)."""
    name = "SM90_COMBINE" if path == "sm90" else "DEFAULT_COMBINE"
    return ab_common.decode_runs(ctx, name, merges, lambda c: f"{path}/c{c}", cuda_path=path)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the JSON written (rewritten after each size)")
    p.add_argument("--sizes", nargs="*", default=["65536:64", "65536:16"], help="CTX:T pairs (none: skip)")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--decode", type=int, nargs="*", default=[65536], help="contexts of the engine runs (none: skip)")
    p.add_argument("--decode-merges", type=int, nargs="+", default=[4, 7, 4], help="the merge of each engine run, in order")
    p.add_argument("--paths", nargs="+", choices=("sm90", "mma"), default=["sm90"], help="the split kernels of the engine runs")
    p.add_argument("--merges", type=int, nargs=2, default=[c for c, _ in kernel.MERGE_ABBA[:2]], metavar=("A", "B"),
                   help="the two merges of the timed rows, A B B A (default: 4 7)")
    a = p.parse_args()
    if a.merges[0] == a.merges[1]:
        p.error("--merges: name two different merges")
    abba = kernel.merge_abba(*a.merges)
    a.paths = list(dict.fromkeys(a.paths))  # (a path named twice would overwrite its own rows)
    if not torch.cuda.is_available():
        raise SystemExit("merge_ab: needs a CUDA GPU")
    if not kernel.hopper() and (a.sizes or "sm90" in a.paths):
        raise SystemExit("merge_ab: the kernel timing (--sizes) and --paths sm90 need an sm_90 GPU; elsewhere run "
                         "`--sizes --paths mma`")
    report = ab_common.Report(a.out)
    for size in a.sizes:
        N, T = (int(x) for x in size.split(":"))
        report.data["sizes"][size] = time_size(N, T, a.samples, abba)
        report.save()
    for path in a.paths:
        for ctx in a.decode:
            report.data["decode"].update(decode(ctx, tuple(a.decode_merges), path))
        report.save()


if __name__ == "__main__":
    main()
