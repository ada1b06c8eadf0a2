"""Why do interleaved rounds read some kernels slower than sequential blocks with the same spin gap (up to 4%
at T=16: perf_history/kernel/final_e2a43f3/seesaw2.log against seesaw2seq.log)? Either the L2 flush leaves part
of a kernel's own data warm for its next sample (sequential blocks: its own; interleaved: another kernel's), or
the change of kernel itself costs (instruction / constant caches, TLB). Times seesaw2 (the dispatched sm90 kernel)
and FlashMLA at 16k and 65k T=16 four ways: sequential and interleaved with the standard flush (2x the L2), and
both again with a flush of FLUSH_X times the L2. If the big flush brings sequential up to interleaved, the flush was
leaving data warm; if not, the kernel change is the cost.
    python3 ci/gpu/flush_probe.py [--flush-x 8] [--out probe.json]"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from kdengine.bench import kernel, timer, verify_timing


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--flush-x", type=int, default=8)
    ap.add_argument("--contexts", default="16384,65536")
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    standard = timer.l2_flush_buffer
    l2 = int(torch.cuda.get_device_properties(0).L2_cache_size)
    big = lambda device: torch.empty(args.flush_x * l2, dtype=torch.uint8, device=device)  # noqa: E731
    rows = []
    for N in (int(c) for c in args.contexts.split(",")):
        T = 16
        sets = {c: verify_timing.input_sets(N=N, T=T, H=kernel.H, chain=c) for c in (False, True)}
        calls = [("seesaw2", *kernel.rotating_call("cuda_sm90_seesaw2", "auto")[:1], sets[False]),
                 ("flashmla", *kernel.rotating_call("flashmla", None)[:1], sets[True])]
        for flush_name, flush in (("2x", standard), (f"{args.flush_x}x", big)):
            timer.l2_flush_buffer = flush
            for order in ("sequential", "interleaved", "sequential"):
                if order == "interleaved":
                    ms = verify_timing.time_verify_many([(c, s) for _, c, s in calls], samples=50)
                else:
                    ms = [verify_timing.time_verify(c, s, samples=50) for _, c, s in calls]
                for (name, _, _), m in zip(calls, ms, strict=True):
                    row = {"N": N, "T": T, "kernel": name, "flush": flush_name, "order": order,
                           "median_us": statistics.median(m.samples) * 1e6}
                    rows.append(row)
                    print(f"ctx{N} T{T} {name:9s} flush {flush_name:3s} {order:11s} {row['median_us']:8.2f} us", flush=True)
        timer.l2_flush_buffer = standard
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"fingerprint": kernel.fingerprint(), "rows": rows}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
