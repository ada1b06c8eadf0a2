"""seesaw2 over uniform splits against seesaw2_stream (stream-K over the SMs) at several costs, then in the decode engine.

With one 64-row block per SM the uniform grid of row tiles x splits leaves SMs idle where it falls short of the SM count
(65k T=64 on the H200: 8 x 16 = 128 blocks on 132 SMs). seesaw2_stream cuts each sequence's KV tiles over all the SMs,
a block that crosses a row tile running a second segment (csrc/verify_sm90.cuh StreamCut); its cost is the KV tiles a
segment's set-up counts as. Rows, timed with their samples interleaved (kdengine.bench.timer.time_gpu_interleaved), each
checked against the fp32 reference first: seesaw2 at the automatic NSPLIT, stream at each cost, seesaw2 again (the A/A
control), at K = 8 launches per replay (the sweep's form) and K = 1. Then the decode engine (the cuda backend, 8
layers, CUDA graphs) with stream mode off / on / on / off (cuda_backend.SM90_STREAM_MIN_TILES None or --min-tiles).
Prints one line per row and writes a JSON (--out).

    python3 ci/gpu/stream_ab.py --out stream_ab.json [--sizes 65536:64 65536:16] [--costs 0 1 2 3] [--samples 40]
        [--decode 65536 16384]
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


def rows_of(costs: list[int], blocks: list[int]) -> list[tuple[str, str, dict]]:
    """(label, backend, layout) of each timed row, in order: seesaw2, stream at each cost (over the SMs), stream over
    each of `blocks` at cost 0, seesaw2 again."""
    return ([("seesaw2", "cuda_sm90_seesaw2", {})]
            + [(f"stream/c{c}", "cuda_sm90_seesaw2_stream", {"stream_cost": c}) for c in costs]
            + [(f"stream/g{g}", "cuda_sm90_seesaw2_stream", {"stream_cost": 0, "stream_blocks": g}) for g in blocks]
            + [(f"stream/g{g}i", "cuda_sm90_seesaw2_stream", {"stream_cost": 32, "stream_blocks": g}) for g in blocks]
            + [("seesaw2/aa", "cuda_sm90_seesaw2", {})])


def check(backend: str, layout: dict, inp, bits) -> float:
    """rel L2 of the row's output against the fp32 reference, its output poisoned first."""
    call, _, result = kernel.launcher(backend, inp, bits, "auto", layout=layout)
    result().fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    ref, _ = verify_attention_reference(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits,
                                        sm_scale=inp.sm_scale, return_lse=True)
    return rel_l2(result(), ref)


def time_size(N: int, T: int, costs: list[int], blocks: list[int], samples: int) -> dict:
    sets = verify_timing.input_sets(N=N, T=T, H=kernel.H, device="cuda")
    rows = rows_of(costs, blocks)
    out = {}
    for label, backend, layout in rows:
        err = check(backend, layout, *sets[0])
        out[f"check/{label}"] = err
        if not err < 1e-2:
            raise SystemExit(f"stream_ab: ctx{N} T{T} {label} rel L2 {err:.3g} against the reference")
    calls = [kernel.rotating_call(backend, "auto", layout=layout)[0] for _, backend, layout in rows]
    for k in (verify_timing.MIN_LAUNCHES, 1):
        launches = max(k, len(sets)) if k > 1 else 1
        got = timer.time_gpu_interleaved([lambda i, c=c: c(*sets[i % len(sets)]) for c in calls], samples=samples,
                                         warmup=3, launches=launches, l2_flush=True, gap_s=verify_timing.GAP_S)
        for (label, _, _), m in zip(rows, got, strict=True):
            out[f"K{launches}/{label}"] = {"median_us": m.median * 1e6, "samples_s": m.samples}
            print(f"ctx{N} T{T} K{launches:<3d} {label:12s} {m.median * 1e6:8.2f} us", flush=True)
    return out


def decode(ctx: int, modes: tuple[bool, ...], min_tiles: int) -> dict:
    """The decode engine at `ctx` once per entry of `modes` (stream mode on: SM90_STREAM_MIN_TILES = min_tiles / off),
    the cuda backend on the sm90 path."""
    from kdengine.engine.run import DecodeSettings, run_decode

    saved = cuda_backend.SM90_STREAM_MIN_TILES
    out = {}
    try:
        for i, on in enumerate(modes):
            cuda_backend.SM90_STREAM_MIN_TILES = min_tiles if on else None
            s = DecodeSettings(config="kimi-k2-tp8-rank", layers=8, context=ctx, budget=63, backend="cuda", steps=32,
                               device="cuda", routing="random")
            d = run_decode(s).to_dict()
            tag = "stream" if on else "uniform"
            label = f"decode{ctx}/{tag}/{modes[:i].count(on)}"
            out[label] = {"tok_per_s": d["tok_per_s"], "mean_step_ms": d["mean_step_ms"], "phase_ms": d["phase_ms"]}
            print(f"{label:24s} {d['tok_per_s']:8.1f} tok/s  step {d['mean_step_ms']:.3f} ms  verify-attention "
                  f"{d['phase_ms'].get('verify-attention', float('nan')):.3f} ms", flush=True)
            torch.cuda.empty_cache()
    finally:
        cuda_backend.SM90_STREAM_MIN_TILES = saved
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the JSON written (rewritten after each size)")
    p.add_argument("--sizes", nargs="*", default=["65536:64", "65536:16"], help="CTX:T pairs (none: skip)")
    p.add_argument("--costs", type=int, nargs="+", default=[0, 1, 2, 3], help="stream costs timed")
    p.add_argument("--blocks", type=int, nargs="*", default=[], help="stream grids timed at cost 0 (e.g. 128: the uniform "
                   "grid's 8 x 16 at 65k T=64, the same cut without a crossing)")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--decode", type=int, nargs="*", default=[65536], help="contexts of the engine runs (none: skip)")
    p.add_argument("--min-tiles", type=int, default=8, help="SM90_STREAM_MIN_TILES of the engine runs with stream mode")
    a = p.parse_args()
    if not torch.cuda.is_available() or not kernel.hopper():
        raise SystemExit("stream_ab: needs an sm_90 GPU (the stream schedule is the sm90 kernel's)")
    info = fingerprint.collect()
    report = {"fingerprint": {**info, "machine": fingerprint.machine_name(info)}, "sizes": {}, "decode": {},
              "stream_min_tiles": cuda_backend.SM90_STREAM_MIN_TILES, "stream_cost": cuda_backend.SM90_STREAM_COST}
    t0 = time.time()

    def save():
        with open(a.out, "w") as f:
            json.dump(report, f, indent=1, default=str)

    for size in a.sizes:
        N, T = (int(x) for x in size.split(":"))
        report["sizes"][size] = time_size(N, T, a.costs, a.blocks, a.samples)
        save()
        print(f"  ({time.time() - t0:.0f} s)", flush=True)
    for ctx in a.decode:
        report["decode"].update(decode(ctx, (False, True, True, False), a.min_tiles))
        save()
        print(f"  ({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
