"""A/A rows: one call timed as several identical rows with their samples interleaved (kdengine.bench.
verify_timing.time_verify_many), at K = 8 launches per replay (the sweep's form) and K = 1. Every row should read the same; a row
that reads differently by its place in the list (its capture order, its predecessor in each round) is a bias of the form.

    python3 ci/gpu/aa_rows.py --out aa_rows.json [--sizes 4096:64 16384:16] [--rows 6] [--samples 40]
"""

from __future__ import annotations

import argparse

import torch

from ci.gpu import ab_common
from kdengine.bench import kernel, verify_timing


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True)
    p.add_argument("--sizes", nargs="+", default=["4096:64", "16384:16", "65536:16"])
    p.add_argument("--rows", type=int, default=6)
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--backend", default="cuda_sm90_dispatched")
    a = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("aa_rows: needs a CUDA GPU")
    report = ab_common.Report(a.out)
    for size in a.sizes:
        N, T = (int(x) for x in size.split(":"))
        sets = verify_timing.input_sets(N=N, T=T, H=kernel.H, device="cuda")
        calls = [kernel.rotating_call(a.backend, "auto")[0] for _ in range(a.rows)]
        out = {}
        for form in (None, 1):  # the sweep's K, then one call per replay
            got = verify_timing.time_verify_many([(c, sets) for c in calls], samples=a.samples, launches=form)
            launches = got[0].launches_per_sample
            med = [m.median * 1e6 for m in got]
            out[f"K{launches}"] = {"median_us": med, "samples_s": [m.samples for m in got]}
            print(f"ctx{N} T{T} K{launches:<3d} " + " ".join(f"{x:7.2f}" for x in med)
                  + f"   spread {max(med) - min(med):.2f} us", flush=True)
        report.data["sizes"][size] = out
        report.save()


if __name__ == "__main__":
    main()
