"""Localise a wrong sm90 result (issue 12): the Hopper kernel against the fp32 reference on inputs that
isolate one product each. q = 0: uniform attention, so out = mean of V (tests P V, the V descriptor and the
merge, not Q K^T); V rows all equal: out = that row whatever the scores (tests normalisation); general
inputs at growing sizes. Prints one line per case; exit 1 when any case is off."""

from __future__ import annotations

import sys

import torch

from kdengine.ops import cuda_backend
from kdengine.ops.inputs import make_verify_inputs, rel_l2
from kdengine.ops.mask import pack_tree_mask
from kdengine.ops.reference import verify_attention_reference


def run(inp, schedule, nsplit):
    B, T, H, _ = inp.q.shape
    bits = pack_tree_mask(inp.tree_mask)
    out = torch.full((B, T, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((B, T, H), float("nan"), dtype=torch.float32, device="cuda")
    cuda_backend.launch_sm90(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, out, lse,
                             sm_scale=inp.sm_scale, nsplit=nsplit, schedule=schedule)
    torch.cuda.synchronize()
    ref, ref_lse = verify_attention_reference(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits,
                                              sm_scale=inp.sm_scale, return_lse=True)
    return rel_l2(out, ref), (lse - ref_lse).abs().max().item(), torch.isfinite(out.float()).all().item()


def main() -> int:
    bad = 0
    cases = [("T1 H1 p63", dict(T=1, H=1, prefix=63)), ("T16 H8 p48", dict(T=16, H=8, prefix=48)),
             ("T16 H8 p1000", dict(T=16, H=8, prefix=1000)), ("T64 H8 p4000", dict(T=64, H=8, prefix=4000))]
    for schedule in sys.argv[1:] or cuda_backend.SCHEDULES:  # (the names given, else every schedule)
        for name, kw in cases:
            for kind in ("q0", "vconst", "general"):
                inp = make_verify_inputs(seed=5, device="cuda", **kw)
                if kind == "q0":
                    inp.q.zero_()
                elif kind == "vconst":
                    inp.kv_cache[:, :, :512] = inp.kv_cache[0, 0, :512]
                for nsplit in (1, 3):
                    err, dlse, finite = run(inp, schedule, nsplit)
                    ok = finite and err < 1e-2 and dlse < 1e-2
                    bad += not ok
                    print(f"{schedule:9s} {name:14s} {kind:8s} nsplit={nsplit}: rel L2 {err:.3e} "
                          f"|dlse| {dlse:.3e} finite={finite} {'ok' if ok else 'BAD'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
