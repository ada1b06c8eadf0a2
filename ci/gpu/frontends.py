"""Why the kernel sweep's dispatched cuda row and the suite's verify/cuda/ctx4096/T<T> (asv, pytest-benchmark,
`kdengine bench`) differ at 4k: both time the same call on the same input sets through kdengine.bench.verify_timing,
yet final_dd10800 read 13.3 / 20.0 us in the sweep against 12.9 / 19.7 in pytest-benchmark at T=16 / 64 (16k and 65k
within 1%). One process, at each T, in this order: the sweep's case (`measure_case`, set peers: its cuda row is timed
first, right after every variant's one checked call), the suite's measurement (`workloads.measure`), the sweep's call
timed alone, the suite's again, the sweep's case again. Equal figures for one call in different positions name the
position as the cause; a constant gap between the two calls names the call.

    python3 ci/gpu/frontends.py [--T 16 64] [--ctx 4096] [--out FILE]
"""

from __future__ import annotations

import argparse
import json

import torch


def main() -> int:
    from kdengine.bench import kernel, roofline, verify_timing, workloads

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--T", type=int, nargs="+", default=[16, 64])
    ap.add_argument("--ctx", type=int, default=4096)
    ap.add_argument("--out", default=None, help="JSON of every figure (default: stdout only)")
    args = ap.parse_args()
    ceil = roofline.ceilings("cuda")
    rows = []

    def note(label: str, T: int, median_s: float) -> None:
        rows.append({"T": T, "what": label, "median_us": median_s * 1e6})
        print(f"ctx{args.ctx} T{T} {label:34s} {median_s * 1e6:8.2f} us", flush=True)

    for T in args.T:
        w = workloads.find(f"verify/cuda/ctx{args.ctx}/T{T}")
        sets = verify_timing.input_sets(N=args.ctx, T=T, H=kernel.H)
        sweep_call, _ = kernel.rotating_call("cuda_auto", "auto")
        for rep in (1, 2):
            case = kernel.measure_case(args.ctx, T, ceil, which="peers")
            note(f"sweep case, cuda row ({rep})", T, case["results"][kernel.DISPATCH]["median_s"])
            note(f"suite workloads.measure ({rep})", T, workloads.measure(w, write=False)["median"])
            note(f"sweep call alone ({rep})", T,
                 verify_timing.time_verify(sweep_call, sets, samples=kernel.SAMPLES).median)
            note(f"suite call on the same sets ({rep})", T,
                 verify_timing.time_verify(workloads._verify_call(w), sets, samples=kernel.SAMPLES).median)
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"ctx": args.ctx, "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
