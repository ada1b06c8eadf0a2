"""How the binding's own checks fail on the GPU: each bad call goes straight into the extension (no Python check in
front), in its own `python -X faulthandler` process, then a good call in the same process. A check must raise
RuntimeError naming what is wrong, and the process must stay usable; a crash shows as the child's exit status and its
faulthandler trace. Until the binding was built with torch's C++ standard (kdengine.ops.build.HOST_CFLAGS) the checks
whose message formats a number crashed (SIGSEGV; perf_history/kernel/pdl_288100a/). tests/ops/test_cuda.py runs the
cases whose message formats a number.

    python3 ci/gpu/binding_errors.py            (prints one line per case; exit 1 when any case misbehaves)
    python3 ci/gpu/binding_errors.py CASE       (one case in this process: what the parent runs)
"""

from __future__ import annotations

import subprocess
import sys

CASES = {
    # name: (what is wrong, the entry point, the message the RuntimeError must hold)
    "sm90_fp32_partials": ("part_out fp32", "launch_sm90", "part_out must be bf16"),
    "mma_fp32_partials": ("part_out fp32", "launch", "part_out must be bf16"),
    "sm90_bad_combine": ("combine 8", "launch_sm90", "combine must be"),
    "sm90_retired_combine_3": ("combine 3 (retired merge)", "launch_sm90", "combine must be -1, 0, 1, 2, 4 or 7"),
    "mma_retired_combine_3": ("combine 3 (retired merge)", "launch", "combine must be 0, 1, 2, 4 or 7"),
    "mma_bad_col_warps": ("col_warps 3", "launch", "col_warps must be"),
    "mma_bad_pingpong": ("pingpong 99", "launch", "pingpong must be"),
    "sm90_noncontiguous": ("q not contiguous", "launch_sm90", "contiguous"),
    "sm90_nsplit_mismatch": ("partials of nsplit + 1", "launch_sm90", "partials must hold nsplit"),
    "sm90_page_size_4": ("page_size 4 (sm90_unsupported)", "launch_sm90", "page_size below 8"),
    "mma_nsplit_2_20": ("nsplit 2^20 at T * H 128 (partials of 4 splits)", "launch", "nsplit * T * H must be below"),
}


def one(case: str) -> int:
    import torch

    from kdengine.ops import build, cuda_backend
    from kdengine.ops.inputs import make_verify_inputs, rel_l2
    from kdengine.ops.mask import pack_tree_mask
    from kdengine.ops.reference import verify_attention_reference

    _, entry, message = CASES[case]
    ext = build.load_extension()

    def call(inp, *, nsplit=4, part_dtype=torch.bfloat16, extra_split=0, combine=None, q=None,
             col_warps=cuda_backend.DEFAULT_COL_WARPS, pingpong=cuda_backend.DEFAULT_PINGPONG):
        B, T, H, _ = inp.q.shape
        bits = pack_tree_mask(inp.tree_mask)
        out = torch.full((B, T, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
        lse = torch.full((B, T, H), float("nan"), dtype=torch.float32, device="cuda")
        splits = min(nsplit, 4) + extra_split  # (a huge nsplit is refused before the partials' shape is read)
        part_out = torch.empty(B, splits, T * H, 512, dtype=part_dtype, device="cuda")
        part_lse = torch.empty(B, splits, T * H, dtype=torch.float32, device="cuda")
        args = (inp.q if q is None else q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, out, lse, part_out,
                part_lse, float(inp.sm_scale), nsplit)
        if combine is None:  # each path's own merge
            combine = cuda_backend.SM90_COMBINE if entry == "launch_sm90" else cuda_backend.DEFAULT_COMBINE
        if entry == "launch_sm90":
            ext.launch_sm90(*args, cuda_backend.SCHEDULES["seesaw2"], combine, False)
        else:
            ext.launch(*args, col_warps, cuda_backend.DEFAULT_ROW_GROUPS, pingpong, combine, True)
        torch.cuda.synchronize()
        return out, bits

    inp = make_verify_inputs(T=16, H=8, prefix=300, seed=3, device="cuda",
                             page_size=4 if case == "sm90_page_size_4" else 64)
    bad = {"sm90_fp32_partials": dict(part_dtype=torch.float32), "mma_fp32_partials": dict(part_dtype=torch.float32),
           "sm90_bad_combine": dict(combine=8), "sm90_retired_combine_3": dict(combine=3),
           "mma_retired_combine_3": dict(combine=3), "mma_bad_col_warps": dict(col_warps=3),
           "mma_bad_pingpong": dict(pingpong=99),
           "sm90_nsplit_mismatch": dict(extra_split=1),
           "sm90_noncontiguous": dict(q=inp.q.transpose(1, 2).contiguous().transpose(1, 2)),
           "sm90_page_size_4": {}, "mma_nsplit_2_20": dict(nsplit=1 << 20)}[case]
    try:
        call(inp, **bad)
    except RuntimeError as exc:
        text = str(exc).splitlines()[0]
        print(f"raised: {text[:160]}", flush=True)
        if message not in str(exc):
            print(f"WRONG MESSAGE: expected {message!r}")
            return 2
    else:
        print("DID NOT RAISE")
        return 3
    good = make_verify_inputs(T=16, H=8, prefix=300, seed=4, device="cuda")
    out, bits = call(good)
    ref, _ = verify_attention_reference(good.q, good.kv_cache, good.page_table, good.prefix_len, bits,
                                        sm_scale=good.sm_scale, return_lse=True)
    err = rel_l2(out, ref)
    print(f"then a good call: rel_l2 {err:.2e}", flush=True)
    return 0 if err < 1e-2 else 4


def main() -> int:
    if len(sys.argv) > 1:
        return one(sys.argv[1])
    failed = 0
    for case, (what, entry, _) in CASES.items():
        r = subprocess.run([sys.executable, "-X", "faulthandler", __file__, case], capture_output=True, text=True,
                           timeout=300)
        lines = (r.stdout + r.stderr).strip().splitlines()
        verdict = "ok" if r.returncode == 0 else f"FAILED (exit {r.returncode})"
        print(f"{case:24s} {entry:11s} {what:32s} {verdict}", flush=True)
        for line in lines[-12:] if r.returncode else lines:
            print(f"    {line}")
        failed += r.returncode != 0
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
