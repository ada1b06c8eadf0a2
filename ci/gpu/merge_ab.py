"""Merge 4 against merge 7 after the dispatched sm90 call, timed two ways, then in the decode engine.

In the sweep (kdengine.bench.verify_timing: K = 8 calls per CUDA-graph replay, back to back) merge 7 was 2.1-2.6 us
slower than 4 after the sm90 call at 65k T=64 (perf_history/kernel/spread2_0117714/), while the merge timeline (one
call per replay after the L2 flush) had its tail 0.4 us shorter. This times both merges A B B A with their samples
interleaved, at K = 8 (the sweep's form) and K = 1 (one call per replay), and then runs the decode engine (the cuda
backend, 8 layers, CUDA graphs) with each merge as the sm90 (or the mma.sync) path's, where each verify call is followed by
other kernels, not by the next split kernel. Prints one line per row and writes a JSON (--out).

    python3 ci/gpu/merge_ab.py --out merge_ab.json [--sizes 65536:64 65536:16] [--samples 40] [--decode 65536]
        [--decode-merges 4 7 7 4] [--paths sm90 mma]
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch

from kdengine.bench import fingerprint, kernel, verify_timing
from kdengine.ops import cuda_backend


def time_size(N: int, T: int, samples: int) -> dict:
    sets = verify_timing.input_sets(N=N, T=T, H=kernel.H, device="cuda")
    calls = [kernel.rotating_call("cuda_sm90_dispatched", "auto", layout={"combine": c})[0]
             for c, _ in kernel.MERGE_ABBA]
    out = {}
    for form in (None, 1):  # the sweep's K, then one call per replay
        rows = verify_timing.time_verify_many([(c, sets) for c in calls], samples=samples, launches=form)
        for (c, tag), m in zip(kernel.MERGE_ABBA, rows, strict=True):
            label = f"K{m.launches_per_sample}/c{c}{tag}"
            out[label] = {"median_us": m.median * 1e6, "samples_s": m.samples}
            print(f"ctx{N} T{T} {label:12s} {m.median * 1e6:8.2f} us", flush=True)
    return out


def decode(ctx: int, merges: tuple[int, ...], path: str) -> dict:
    """The decode engine at `ctx` once per merge in `merges` (in that order), each as `path`'s merge (its module value,
    read at every launch), the cuda backend on that path (KDENGINE_CUDA_PATH)."""
    from kdengine.engine.run import DecodeSettings, run_decode

    name = "SM90_COMBINE" if path == "sm90" else "DEFAULT_COMBINE"
    saved, saved_path = getattr(cuda_backend, name), os.environ.get("KDENGINE_CUDA_PATH")
    os.environ["KDENGINE_CUDA_PATH"] = path
    out = {}
    try:
        for i, c in enumerate(merges):
            setattr(cuda_backend, name, c)
            s = DecodeSettings(config="kimi-k2-tp8-rank", layers=8, context=ctx, budget=63, backend="cuda", steps=32,
                               device="cuda", routing="random")
            d = run_decode(s).to_dict()
            label = f"decode{ctx}/{path}/c{c}/{merges[:i].count(c)}"
            out[label] = {"tok_per_s": d["tok_per_s"], "mean_step_ms": d["mean_step_ms"], "phase_ms": d["phase_ms"]}
            print(f"{label:24s} {d['tok_per_s']:8.1f} tok/s  step {d['mean_step_ms']:.3f} ms  verify-attention "
                  f"{d['phase_ms'].get('verify-attention', float('nan')):.3f} ms", flush=True)
            torch.cuda.empty_cache()
    finally:
        setattr(cuda_backend, name, saved)
        if saved_path is None:
            os.environ.pop("KDENGINE_CUDA_PATH", None)
        else:
            os.environ["KDENGINE_CUDA_PATH"] = saved_path
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the JSON written (rewritten after each size)")
    p.add_argument("--sizes", nargs="*", default=["65536:64", "65536:16"], help="CTX:T pairs (none: skip)")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--decode", type=int, nargs="*", default=[65536], help="contexts of the engine runs (none: skip)")
    p.add_argument("--decode-merges", type=int, nargs="+", default=[4, 7, 4], help="the merge of each engine run, in order")
    p.add_argument("--paths", nargs="+", choices=("sm90", "mma"), default=["sm90"], help="the split kernels of the engine runs")
    a = p.parse_args()
    a.paths = list(dict.fromkeys(a.paths))  # (a path named twice would overwrite its own rows)
    if not torch.cuda.is_available():
        raise SystemExit("merge_ab: needs a CUDA GPU")
    if not kernel.hopper() and (a.sizes or "sm90" in a.paths):
        raise SystemExit("merge_ab: the kernel timing (--sizes) and --paths sm90 need an sm_90 GPU; elsewhere run "
                         "`--sizes --paths mma`")
    info = fingerprint.collect()
    report = {"fingerprint": {**info, "machine": fingerprint.machine_name(info)}, "sizes": {}, "decode": {}}
    t0 = time.time()

    def save():
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1, default=str)

    for size in a.sizes:
        N, T = (int(x) for x in size.split(":"))
        report["sizes"][size] = time_size(N, T, a.samples)
        save()
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    for path in a.paths:
        for ctx in a.decode:
            report["decode"].update(decode(ctx, tuple(a.decode_merges), path))
        save()
        print(f"  ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
