"""Kernel-level benchmark of verify attention on one GPU: CUDA events around CUDA-graph replays
(L2 flushed before every sample), written as JSON with the GPU fingerprint, and the renderer of its
table (`python -m ci record` puts that table into perf_history/records/verify_kernel_cudagraph.txt,
beside the asv section, through render_doc; never written by hand).

    python -m kdengine.ops.bench_kernel measure --out perf_history/kernel/<name>.json
    python -m kdengine.ops.bench_kernel render perf_history/kernel/*.json [--out FILE]   (the table; stdout)
    python -m kdengine.ops.bench_kernel once --T 16 --prefix 300     (one checked call: sanitizers, ncu)

Workloads: per layer, one rank, H=8, B=1, page_size 64, context N = prefix + T tokens.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import statistics
import subprocess
import sys
from pathlib import Path

import torch

CONTEXTS = (4096, 16384, 65536)
TREE_SIZES = (16, 64)
NSPLITS = (16, 32, 64, 128, 256, "auto")
H = 8
SAMPLES = 60
FLUSH_BYTES = 256 << 20

# --- timing -------------------------------------------------------------------------------------------


def time_graph(call, samples: int = SAMPLES) -> list[float]:
    """Seconds per call: capture one call in a CUDA graph, replay it `samples` times with an L2 flush
    (a 256 MB memset, outside the events) before each replay."""
    for _ in range(3):
        call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    flush = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device="cuda")
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(samples)]
    graph.replay()
    for start, end in events:
        flush.zero_()
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1e-3 for s, e in events]


def measure_ceilings() -> dict:
    """Device copy bandwidth (read + write bytes / s) and dense bf16 matmul rate, measured here."""
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    copy = statistics.median(time_graph(lambda: dst.copy_(src), 20))
    a = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    b = torch.randn(8192, 8192, dtype=torch.bfloat16, device="cuda")
    mm = statistics.median(time_graph(lambda: a @ b, 20))
    return {"copy_bytes_per_s": 2 * (1 << 30) / copy, "matmul_flops_per_s": 2 * 8192**3 / mm}


def floor_seconds(N: int, T: int, ceilings: dict) -> float:
    bytes_ = N * 576 * 2 + T * H * (576 + 512) * 2
    flops = 2 * T * H * N * 1088
    return max(bytes_ / ceilings["copy_bytes_per_s"], flops / ceilings["matmul_flops_per_s"])


# --- workloads ----------------------------------------------------------------------------------------


def make_problem(N: int, T: int):
    from kdengine.ops.inputs import make_verify_inputs
    from kdengine.ops.mask import pack_tree_mask

    inp = make_verify_inputs(B=1, T=T, H=H, prefix=N - T, seed=N + T, device="cuda")
    return inp, pack_tree_mask(inp.tree_mask)


def torch_unfused(inp, bits, N: int):
    """Plain torch, one op at a time (bf16 matmuls, fp32 softmax); N is host-known so it captures."""
    from kdengine.ops.mask import unpack_tree_mask

    q, kv_cache, page_table = inp.q, inp.kv_cache, inp.page_table
    T = q.shape[1]
    page_size = kv_cache.shape[1]
    pos = torch.arange(N, device=q.device)
    allowed = torch.ones(T, N, dtype=torch.bool, device=q.device)
    tree = unpack_tree_mask(bits, T)[0]

    def call():
        kv = kv_cache[page_table[0, pos // page_size].long(), pos % page_size]  # [N, 576]
        scores = torch.einsum("thd,nd->thn", q[0], kv).float() * inp.sm_scale  # [T, H, N]
        allowed[:, N - T :] = tree
        scores = scores.masked_fill(~allowed[:, None, :], float("-inf"))
        probs = torch.softmax(scores, dim=-1).to(kv.dtype)
        return torch.einsum("thn,nd->thd", probs, kv[:, :512])

    return call


def backend_call(name: str, inp, bits, nsplit, *, scalar_loads: bool = False, layout=None):
    if name == "cuda":
        from kdengine.ops import cuda_backend

        cw, rg, combine, pp = layout or (cuda_backend.DEFAULT_COL_WARPS, cuda_backend.DEFAULT_ROW_GROUPS,
                                         cuda_backend.DEFAULT_COMBINE, cuda_backend.DEFAULT_PINGPONG)
        splits = cuda_backend.plan_nsplit(inp.q, inp.kv_cache, inp.page_table, nsplit, rg, cw, pp)
        B, T, Hq, _ = inp.q.shape
        out = torch.empty(B, T, Hq, 512, dtype=torch.bfloat16, device="cuda")
        lse = torch.empty(B, T, Hq, dtype=torch.float32, device="cuda")
        args = (inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, out, lse)
        call = lambda: cuda_backend.launch(*args, sm_scale=inp.sm_scale, nsplit=splits, scalar_loads=scalar_loads,
                                           col_warps=cw, row_groups=rg, combine=combine, pingpong=pp)
        return call, splits, lambda: out
    module = importlib.import_module(f"kdengine.ops.{ {'triton': 'triton_verify', 'triton_extend': 'triton_extend'}[name] }")
    reason = module.available(inp.q.device)
    if reason is not None:
        raise RuntimeError(reason)
    result = {}

    def call():
        result["out"] = module.run(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits,
                                   sm_scale=inp.sm_scale, nsplit=nsplit, return_lse=False)[0]

    return call, nsplit, lambda: result["out"]


def variants(N: int, T: int):
    """(label, backend, nsplit, scalar_loads, (col_warps, row_groups, combine, pingpong)) measured at
    one size: every NSPLIT for the wide layout (64 rows per block, parallel merge) with and without
    ping-pong halves, the wide layout at 32 rows and the 2-warp layout with the serial merge (the
    previous default) without NSPLIT 256, the previous layout with the parallel merge and the
    scalar-load build at the automatic NSPLIT."""
    label = lambda cw, rg, comb, pp: f"cw{cw}rg{rg}" + ("/comb1" if comb else "") + ("/pp" if pp else "")
    short = NSPLITS[:4] + ("auto",)
    sweeps = (((8, 4, 1, False), NSPLITS), ((8, 4, 1, True), NSPLITS), ((8, 2, 1, True), short),
              ((2, 4, 0, False), short))
    out = [(f"cuda/{label(*lay)}/s{s}", "cuda", s, False, lay) for lay, splits in sweeps for s in splits]
    out += [("cuda/cw8rg2/comb1/sauto", "cuda", "auto", False, (8, 2, 1, False))]
    out += [("cuda/cw2rg4/comb1/sauto", "cuda", "auto", False, (2, 4, 1, False))]
    out += [("cuda_scalar/cw8rg4/comb1/sauto", "cuda", "auto", True, (8, 4, 1, False))]
    out += [("triton", "triton", None, False, None), ("torch", "torch", None, False, None)]
    if (N, T) == (65536, 16):
        out.append(("triton_extend", "triton_extend", None, False, None))
    if (N, T) == (65536, 64):  # one wave (16 x 8 programs) against one program past it (17 x 8)
        out += [(f"triton/s{s}", "triton", s, False, None) for s in (16, 17)]
    return out


def measure_case(N: int, T: int, ceilings: dict) -> dict:
    from kdengine.ops.inputs import rel_l2
    from kdengine.ops.reference import verify_attention_reference

    inp, bits = make_problem(N, T)
    ref = verify_attention_reference(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, sm_scale=inp.sm_scale)[0]
    floor = floor_seconds(N, T, ceilings)
    rows = {}
    for label, backend, nsplit, scalar, cw in variants(N, T):
        try:
            if backend == "torch":
                call = torch_unfused(inp, bits, N)
                splits, result = None, call
            else:
                call, splits, result = backend_call(backend, inp, bits, nsplit, scalar_loads=scalar, layout=cw)
            samples = time_graph(call)
            err = rel_l2(result().reshape(ref.shape), ref)
        except Exception as exc:  # noqa: BLE001 - a backend that cannot run is recorded, not fatal
            rows[label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
            print(f"ctx{N} T{T} {label}: {rows[label]['error']}", flush=True)
            continue
        median = statistics.median(samples)
        rows[label] = {"median_s": median, "samples": samples, "nsplit": splits, "rel_l2": err,
                       "floor_pct": 100 * floor / median}
        print(f"ctx{N} T{T} {label:30s} nsplit={splits!s:5s} {median * 1e6:9.1f} us  "
              f"{100 * floor / median:5.1f}% of floor  relL2={err:.2e}", flush=True)
    return {"N": N, "T": T, "H": H, "floor_s": floor, "results": rows}


def fingerprint() -> dict:
    from kdengine.bench import fingerprint as fp

    info = fp.collect()
    clocks = getattr(fp, "clocks", None)
    info["clocks"] = clocks() if clocks else {}
    try:
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu",
             "--format=csv"], capture_output=True, text=True, timeout=20).stdout.strip()
    except OSError:
        info["nvidia_smi"] = None
    return info


def measure(args) -> int:
    contexts = [int(c) for c in args.contexts.split(",")]
    start = fingerprint()
    if not start.get("commit") and args.commit:  # a copy of the tree without .git (device runners)
        start["commit"], start["dirty"] = args.commit, None
    ceilings = measure_ceilings()
    print(f"ceilings: copy {ceilings['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 mm {ceilings['matmul_flops_per_s'] / 1e12:.0f} TF/s")
    doc = {"schema": 1, "kind": "verify_kernel_cudagraph", "date": dt.datetime.now(dt.timezone.utc).isoformat(),
           "method": f"CUDA events around CUDA-graph replays of one call, L2 flushed (256 MB memset) before each "
                     f"of {SAMPLES} samples; median", "fingerprint": start, "clocks_end": None,
           "ceilings": ceilings, "cases": []}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for N in contexts:
        for T in TREE_SIZES:
            doc["cases"].append(measure_case(N, T, ceilings))
            doc["clocks_end"] = fingerprint().get("clocks")
            Path(args.out).write_text(json.dumps(doc, indent=1))  # after every case: a cut-short run keeps its data
    print(f"wrote {args.out}")
    return 0


# --- rendering ----------------------------------------------------------------------------------------


def render_doc(doc: dict) -> str:
    fp = doc["fingerprint"]
    ceil = doc["ceilings"]
    lines = [
        f"verify attention kernel, per layer (H={H}, B=1, page 64), {doc['method']}",
        f"GPU {fp.get('gpu')} ({fp.get('sm_count')} SMs, {fp.get('capability')}), torch {fp.get('torch')}, "
        f"triton {fp.get('triton')}, CUDA {fp.get('cuda')}, commit {str(fp.get('commit'))[:10]}"
        f"{' (dirty)' if fp.get('dirty') else ''}, {doc['date'][:19]}",
        f"ceilings measured: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul "
        f"{ceil['matmul_flops_per_s'] / 1e12:.0f} TF/s; floor = max(bytes/copy, flops/matmul)",
        "",
        f"{'ctx':>6} {'T':>3}  {'backend':30s} {'nsplit':>6} {'median us':>10} {'tok/s':>10} {'% floor':>8} "
        f"{'x extend':>9} {'x torch':>8}",
    ]
    for case in doc["cases"]:
        res = case["results"]
        ext = next((c["results"].get("triton_extend", {}).get("median_s") for c in doc["cases"]
                    if (c["N"], c["T"]) == (case["N"], case["T"])), None)
        torch_s = res.get("torch", {}).get("median_s")
        for label, row in res.items():
            if "error" in row:
                lines.append(f"{case['N']:>6} {case['T']:>3}  {label:30s} unavailable: {row['error'][:60]}")
                continue
            t = row["median_s"]
            x_ext = f"{ext / t:9.1f}" if ext else f"{'-':>9}"
            x_torch = f"{torch_s / t:8.1f}" if torch_s else f"{'-':>8}"
            lines.append(f"{case['N']:>6} {case['T']:>3}  {label:30s} {row['nsplit']!s:>6} {t * 1e6:10.1f} "
                         f"{case['T'] / t:10.0f} {row['floor_pct']:8.1f} {x_ext} {x_torch}")
        lines.append("")
    return "\n".join(lines)


def render(args) -> int:
    docs = [json.loads(Path(p).read_text()) for p in args.inputs]
    text = "\n\n".join(render_doc(d) for d in sorted(docs, key=lambda d: d["date"]))
    text = "# generated by `python -m kdengine.ops.bench_kernel render` from perf_history/kernel/*.json\n" + text
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


def once(args) -> int:
    """One checked cuda call (for compute-sanitizer and ncu)."""
    from kdengine.ops import cuda_backend
    from kdengine.ops.inputs import make_verify_inputs, rel_l2
    from kdengine.ops.mask import pack_tree_mask
    from kdengine.ops.verify import verify_attention

    inp = make_verify_inputs(B=args.B, T=args.T, H=args.H, prefix=args.prefix, seed=1, device="cuda")
    if args.pingpong is None:
        out = verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="cuda", nsplit=args.nsplit)
    else:  # the wide layout with or without ping-pong halves, whatever the default
        call, _, result = backend_call("cuda", inp, pack_tree_mask(inp.tree_mask), args.nsplit,
                                       layout=(cuda_backend.WIDE, cuda_backend.DEFAULT_ROW_GROUPS,
                                               cuda_backend.DEFAULT_COMBINE, bool(args.pingpong)))
        call()
        out = result()
    ref = verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="reference")
    err = rel_l2(out, ref)
    print(f"once B={args.B} T={args.T} H={args.H} prefix={args.prefix}: rel L2 {err:.2e}")
    return 0 if err < 1e-2 else 1


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kdengine.ops.bench_kernel")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("measure")
    p.add_argument("--out", required=True)
    p.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    p.add_argument("--commit", default=None, help="the commit measured, when the tree has no .git")
    p.set_defaults(func=measure)
    p = sub.add_parser("render")
    p.add_argument("inputs", nargs="+")
    p.add_argument("--out", default=None, help="also write the table here (the records file is ci record's)")
    p.set_defaults(func=render)
    p = sub.add_parser("once")
    for name, default in (("B", 1), ("T", 16), ("H", 8), ("prefix", 300)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--nsplit", type=int, default=None)
    p.add_argument("--pingpong", type=int, choices=(0, 1), default=None,
                   help="run the wide layout with (1) or without (0) ping-pong halves instead of the default")
    p.set_defaults(func=once)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
