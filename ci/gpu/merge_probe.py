"""Device probe of the verify merge (issue 12), run against whichever kdengine is on PYTHONPATH (this
branch or a baseline checkout: it uses only calls both have).

    python ci/gpu/merge_probe.py calls --combines 2 3      one split + merge per (path, T, combine) at 65k,
                                                          for ncu (-k regex:combine)
    python ci/gpu/merge_probe.py time --out base.json     end-to-end medians of both cuda paths' defaults
                                                          (kdengine.bench.verify_timing, the kernel sweep's
                                                          timing) at the six sizes, with the fingerprint
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

CTX = 65536
H = 8


def calls(args) -> int:
    from kdengine.ops import cuda_backend
    from kdengine.ops.inputs import make_verify_inputs
    from kdengine.ops.mask import pack_tree_mask

    for T in args.T:
        inp = make_verify_inputs(B=1, T=T, H=H, prefix=CTX - T, seed=1, device="cuda")
        bits = pack_tree_mask(inp.tree_mask)
        out, lse = cuda_backend.alloc_outputs(inp.q)
        a = (inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, out, lse)
        for path in args.paths:
            for combine in args.combines:
                if path == "sm90":
                    n = cuda_backend.plan_nsplit_sm90(inp.q, inp.kv_cache, inp.page_table, None)
                    cuda_backend.launch_sm90(*a, sm_scale=inp.sm_scale, nsplit=n, combine=combine)
                else:
                    n = cuda_backend.plan_nsplit(inp.q, inp.kv_cache, inp.page_table, None)
                    cuda_backend.launch(*a, sm_scale=inp.sm_scale, nsplit=n, combine=combine)
                torch.cuda.synchronize()
                print(f"call {path} T={T} combine={combine} nsplit={n}", flush=True)
    return 0


def time_paths(args) -> int:
    from kdengine.bench import kernel, verify_timing

    rows = {"cuda": "cuda", "cuda_sm90_staggered": "cuda_sm90_staggered"}
    doc = {"kind": "merge_probe_time", "fingerprint": kernel.fingerprint(), "cases": []}
    if args.commit:
        doc["fingerprint"]["git_head"], doc["fingerprint"]["commit"] = doc["fingerprint"].get("commit"), args.commit
    for N in kernel.CONTEXTS:
        for T in kernel.TREE_SIZES:
            sets = verify_timing.input_sets(N=N, T=T, H=H)
            case = {"N": N, "T": T, "results": {}}
            for label, name in rows.items():
                call, made = kernel.rotating_call(name, "auto")
                m = verify_timing.time_verify(call, sets, samples=kernel.SAMPLES, capturable=True)
                case["results"][label] = {"median_s": m.median, "samples": m.samples, "throttled": m.throttled,
                                          "nsplit": made[id(sets[0][0])][1]}
                print(f"ctx{N} T{T} {label:22s} {m.median * 1e6:8.1f} us", flush=True)
            doc["cases"].append(case)
            Path(args.out).write_text(json.dumps(doc, indent=1))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="merge_probe")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("calls")
    p.add_argument("--combines", type=int, nargs="+", default=[2])
    p.add_argument("--T", type=int, nargs="+", default=[16, 64])
    p.add_argument("--paths", nargs="+", default=["mma", "sm90"])
    p.set_defaults(func=calls)
    p = sub.add_parser("time")
    p.add_argument("--out", required=True)
    p.add_argument("--commit", default=None)
    p.set_defaults(func=time_paths)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
