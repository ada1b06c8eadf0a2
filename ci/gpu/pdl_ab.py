"""The sm90 split kernel launched as a programmatic dependent of the kernel before it, against a plain launch.

Rows (seesaw2, staggered_small, each plain and as a programmatic dependent; seesaw2 again as the A/A control), timed with
their samples interleaved and checked against the fp32 reference first, at K = 8 launches per replay (each split kernel
after the previous call's merge) and K = 1 (after the L2 flush). Then the decode engine (the cuda backend, 8 layers, CUDA
graphs) with cuda_backend.SM90_SPLIT_PDL off / on / on / off. Prints one line per row and writes a JSON (--out).

    python3 ci/gpu/pdl_ab.py --out pdl_ab.json [--sizes 65536:64 65536:16] [--samples 40] [--decode 65536]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

from kdengine.bench import fingerprint, kernel, timer, verify_timing
from kdengine.ops import cuda_backend
from kdengine.ops.inputs import rel_l2
from kdengine.ops.reference import verify_attention_reference

ROWS = [("seesaw2", "cuda_sm90_seesaw2"), ("pdl", "cuda_sm90_seesaw2_pdl"), ("small", "cuda_sm90_staggered_small"),
        ("small/pdl", "cuda_sm90_staggered_small_pdl"), ("seesaw2/aa", "cuda_sm90_seesaw2")]


def check(backend: str, inp, bits) -> float:
    """rel L2 of the row's output against the fp32 reference, its output poisoned first."""
    call, _, result = kernel.launcher(backend, inp, bits, "auto")
    result().fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    ref, _ = verify_attention_reference(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits,
                                        sm_scale=inp.sm_scale, return_lse=True)
    return rel_l2(result(), ref)


def time_size(N: int, T: int, samples: int) -> dict:
    sets = verify_timing.input_sets(N=N, T=T, H=kernel.H, device="cuda")
    out = {}
    for label, backend in ROWS:
        err = check(backend, *sets[0])
        out[f"check/{label}"] = err
        if not err < 1e-2:
            raise SystemExit(f"pdl_ab: ctx{N} T{T} {label} rel L2 {err:.3g} against the reference")
    calls = [kernel.rotating_call(backend, "auto")[0] for _, backend in ROWS]
    for k in (verify_timing.MIN_LAUNCHES, 1):
        launches = max(k, len(sets)) if k > 1 else 1
        got = timer.time_gpu_interleaved([lambda i, c=c: c(*sets[i % len(sets)]) for c in calls], samples=samples,
                                         warmup=3, launches=launches, l2_flush=True, gap_s=verify_timing.GAP_S)
        for (label, _), m in zip(ROWS, got, strict=True):
            out[f"K{launches}/{label}"] = {"median_us": m.median * 1e6, "samples_s": m.samples}
            print(f"ctx{N} T{T} K{launches:<3d} {label:12s} {m.median * 1e6:8.2f} us", flush=True)
    return out


def decode(ctx: int, modes: tuple[bool, ...]) -> dict:
    """The decode engine at `ctx` once per entry of `modes` (cuda_backend.SM90_SPLIT_PDL), on the sm90 path."""
    from kdengine.engine.run import DecodeSettings, run_decode

    saved = cuda_backend.SM90_SPLIT_PDL
    out = {}
    try:
        for i, c in enumerate(modes):
            cuda_backend.SM90_SPLIT_PDL = c
            s = DecodeSettings(config="kimi-k2-tp8-rank", layers=8, context=ctx, budget=63, backend="cuda", steps=32,
                               device="cuda", routing="random")
            d = run_decode(s).to_dict()
            label = f"decode{ctx}/{'pdl' if c else 'plain'}/{modes[:i].count(c)}"
            out[label] = {"tok_per_s": d["tok_per_s"], "mean_step_ms": d["mean_step_ms"], "phase_ms": d["phase_ms"]}
            print(f"{label:24s} {d['tok_per_s']:8.1f} tok/s  step {d['mean_step_ms']:.3f} ms  verify-attention "
                  f"{d['phase_ms'].get('verify-attention', float('nan')):.3f} ms", flush=True)
            torch.cuda.empty_cache()
    finally:
        cuda_backend.SM90_SPLIT_PDL = saved
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the JSON written (rewritten after each size)")
    p.add_argument("--sizes", nargs="*", default=["65536:64", "65536:16"], help="CTX:T pairs (none: skip)")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--decode", type=int, nargs="*", default=[65536], help="contexts of the engine runs (none: skip)")
    a = p.parse_args()
    if not torch.cuda.is_available() or not kernel.hopper():
        raise SystemExit("pdl_ab: needs an sm_90 GPU (the sm90 kernel's launch)")
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
    for ctx in a.decode:
        report["decode"].update(decode(ctx, (False, True, True, False)))
        save()
        print(f"  ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
