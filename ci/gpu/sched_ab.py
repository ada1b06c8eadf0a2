"""A/B of sm90 schedules (or any kernel-sweep backends) on the same inputs, then in the decode engine.

Rows: the backends named by --rows (kdengine.bench.kernel's names, e.g. cuda_sm90_seesaw2 cuda_sm90_seesaw2_bulk
cuda_sm90_seesaw2_bulk cuda_sm90_seesaw2: A B B A, the second pair the A/A control). At each size every row is first
checked against the fp32 reference (its output poisoned before the call), then all rows are timed with their samples
interleaved (kdengine.bench.verify_timing.time_verify_many) at the sweep's K launches per replay and at K = 1. Then the
decode engine (the cuda backend, 8 layers, CUDA graphs) at each --decode context with the kdengine.ops.cuda_backend
attribute --flag off / on / on / off (--decode-order; AAAA runs the form as an A/A: whether a run's place in the process
biases it). Prints one line per row and rewrites the JSON (--out) after each size.

    python3 ci/gpu/sched_ab.py --out ab.json --rows cuda_sm90_seesaw2 cuda_sm90_seesaw2_bulk \\
        cuda_sm90_seesaw2_bulk cuda_sm90_seesaw2 --flag SM90_BULK [--sizes 65536:64 65536:16] [--decode 65536]
    # the engine form's own A/A (the flag never set): whether the second run of a process reads low
    python3 ci/gpu/sched_ab.py --out aa.json --rows cuda_sm90_seesaw2 --sizes --flag DEFAULT_MERGE_EARLY \
        --decode 65536 16384 --decode-order AAAAAAAA
"""

from __future__ import annotations

import argparse

import torch

from ci.gpu import ab_common
from kdengine.bench import kernel, verify_timing
from kdengine.ops import cuda_backend
from kdengine.ops.inputs import rel_l2
from kdengine.ops.reference import verify_attention_reference


def check(backend: str, inp, bits) -> float:
    """rel L2 of the row's output against the fp32 reference, its output poisoned (NaN) first."""
    call, _, result = kernel.launcher(backend, inp, bits, "auto")
    result().fill_(float("nan"))
    call()
    torch.cuda.synchronize()
    ref, _ = verify_attention_reference(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits,
                                        sm_scale=inp.sm_scale, return_lse=True)
    return rel_l2(result(), ref)


def labels(rows: list[str]) -> list[str]:
    """Row labels: the backend name, with /aa<k> on its k-th repeat."""
    return [r if rows[:i].count(r) == 0 else f"{r}/aa{rows[:i].count(r)}" for i, r in enumerate(rows)]


def time_size(N: int, T: int, rows: list[str], samples: int, H: int) -> dict:
    sets = verify_timing.input_sets(N=N, T=T, H=H, device="cuda")
    out = {}
    for backend in dict.fromkeys(rows):
        err = check(backend, *sets[0])
        out[f"check/{backend}"] = err
        if not err < 1e-2:
            raise SystemExit(f"sched_ab: ctx{N} T{T} {backend} rel L2 {err:.3g} against the reference")
    calls = [kernel.rotating_call(backend, "auto")[0] for backend in rows]
    for form in (None, 1):  # the sweep's K, then one call per replay
        got = verify_timing.time_verify_many([(c, sets) for c in calls], samples=samples, launches=form)
        k = got[0].launches_per_sample
        for label, m in zip(labels(rows), got, strict=True):
            out[f"K{k}/{label}"] = {"median_us": m.median * 1e6, "samples_s": m.samples}
            print(f"ctx{N} T{T} H{H} K{k:<3d} {label:36s} {m.median * 1e6:8.2f} us", flush=True)
    return out


def decode(ctx: int, flag: str, modes: tuple[bool, ...]) -> dict:
    """The decode engine at `ctx` once per entry of `modes` (cuda_backend.<flag>)."""
    return ab_common.decode_runs(ctx, flag, modes, lambda on: f"{flag}={int(on)}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the JSON written (rewritten after each size)")
    p.add_argument("--rows", nargs="+", required=True, help="backend names, in the order timed (repeat one for A/A)")
    p.add_argument("--sizes", nargs="*", default=["65536:64", "65536:16"], help="CTX:T pairs (none: skip)")
    p.add_argument("--samples", type=int, default=40)
    p.add_argument("--heads", type=int, default=kernel.H, help=f"query heads H (default {kernel.H})")
    p.add_argument("--flag", help="a boolean kdengine.ops.cuda_backend attribute the engine runs toggle")
    p.add_argument("--decode", type=int, nargs="*", default=[], help="contexts of the engine runs (needs --flag)")
    p.add_argument("--decode-order", default="ABBA",
                   help="the engine runs' order, A = --flag off, B = on (default ABBA; AAAA: an A/A of the form itself)")
    a = p.parse_args()
    unknown = [r for r in a.rows if r not in kernel.SM90_BACKENDS and not r.startswith(("cuda", "mma"))]
    if unknown:
        raise SystemExit(f"sched_ab: --rows: unknown backends {unknown}")
    if a.decode and (a.flag is None or not isinstance(getattr(cuda_backend, a.flag, None), bool)):
        raise SystemExit(f"sched_ab: --decode needs --flag naming a boolean cuda_backend attribute, got {a.flag!r}")
    if len(a.decode_order) < 2 or set(a.decode_order) - {"A", "B"}:
        raise SystemExit(f"sched_ab: --decode-order: expected 2 or more of the letters A and B, got {a.decode_order!r}")
    if not torch.cuda.is_available():
        raise SystemExit("sched_ab: needs a CUDA GPU")
    if a.heads < 1:
        raise SystemExit(f"sched_ab: --heads: expected >= 1, got {a.heads}")
    report = ab_common.Report(a.out, rows=a.rows, heads=a.heads)
    for size in a.sizes:
        N, T = (int(x) for x in size.split(":"))
        report.data["sizes"][size] = time_size(N, T, a.rows, a.samples, a.heads)
        report.save()
    for ctx in a.decode:
        report.data["decode"].update(decode(ctx, a.flag, tuple(c == "B" for c in a.decode_order)))
        report.save()


if __name__ == "__main__":
    main()
