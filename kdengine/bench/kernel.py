"""The kernel sweep of verify attention on one GPU: every cuda layout and NSPLIT, triton, the unfused
torch composition and the peers, timed by the one measurement core (kdengine.bench.verify_timing, the
ceilings of kdengine.bench.roofline), written as JSON with the GPU fingerprint; and the renderer of its
table (`python -m ci record` puts it into perf_history/records/verify_kernel_cudagraph.txt beside the
asv section, through render_doc; never written by hand).

    python -m kdengine.bench.kernel measure --out perf_history/kernel/<name>.json [--set full|peers]
    python -m kdengine.bench.kernel render perf_history/kernel/*.json [--out FILE]   (the table; stdout)
    python -m kdengine.bench.kernel once --T 16 --prefix 300     (one checked call: sanitizers, ncu)
    python -m kdengine.bench.kernel measure --set merge ...      (the sm90 merge's share: with / without it)

Workloads: per layer, one rank, H=8, B=1, page_size 64, context N = prefix + T tokens; the same inputs
and the same timing as the suite's verify/<backend>/ctx<N>/T<T> (so the default cuda row and
verify/cuda/... agree within run-to-run noise). Schema 1 documents (before the one core: one call per
graph replay, the copy ceiling timed inside a graph) still render.
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib
import json
import subprocess
import sys
from pathlib import Path

import torch

from kdengine.bench import peers, roofline, verify_timing
from kdengine.ops.cuda_backend import DEFAULT_COMBINE
from kdengine.ops.shapes import DV

CONTEXTS = (4096, 16384, 65536)
TREE_SIZES = (16, 64)
NSPLITS = (16, 32, 64, 128, 256, "auto")
SETS = ("full", "peers", "mma", "mma2", "mma4", "mma6", "sm90", "paths", "pair", "half", "icache", "seesaw2",
        "nsplit", "nsplit2", "merge", "pdl", "spread")
# (the sets s2tune, s2t64, s2t64r, s2ab, s2mid, ring4, stsm, late, d32, g2, la, h, s4, res and res2 timed seesaw2's
# probes, gone since: their records stay in perf_history/kernel/verify_kernel_{s2tune,s2t64,s2t64r65k,s2t6465k,s2ab,
# s2ab2,s2mid,ring4,stsm0,stsm1,late0,late1,d32_0,d32_1,g2_0,g2_1,la_0,la_1,h_0,h_1,s4_0,s4_1,res_0,res_1,res2_0,
# res2_1}_*.json; tb timed seesaw2_tb, dropped: perf_history/kernel/verify_kernel_tb_{0,1}_*_0117714.json, tb_0117714/;
# the set merge2 timed the grouped merges 3
# and 4 against each other, gone with merge 3: its records are perf_history/kernel/verify_kernel_merge2{0,1}_*_b44f69a.json
# and merge2_b44f69a/)
# The `merge` set: the sm90 schedule the dispatched call picks (cuda_backend.pick_schedule) with the merge
# kernel, and the same split kernel alone (no merge: the merge's in-graph share is the difference). Up to
# commit 1cd259e it timed DEFAULT_SCHEDULE (staggered) at every size, though from 8 KV tiles per split the
# call dispatched staggered_small (perf_history/kernel/sm90_small4k_5d97cc8/verify_kernel_merge_5d97cc8.json
# times the schedule each size dispatched then). Records of the set `fuse` (..._fuse_*.json) also time the
# fused merges that were removed (csrc/verify_sm90.cuh header).
# mma.sync layouts by name (`once --path`, the `mma2` set): (col_warps, row_groups, combine, pingpong) of
# kdengine.ops.cuda_backend; "mma" is its default. x16pp: wide2x16 (16 warps, 4 per scheduler) with
# ping-pong halves of 8 warps; x16: the same without ping-pong; wide2pp: wide2 (8 warps) with ping-pong;
# wide2pp2: wide2 with both halves' P*V split around the barrier (pingpong 2); wide2pp2_lean: the same
# schedule with less integer work per tile (pingpong 3, csrc/verify_wide_lean.cuh); mma_lean_*: the lean probes of branch
# mma4 (pingpong 4-11, kdengine.ops.cuda_backend.PINGPONGS), mma_lean_v5 (all of them, pingpong 8) the default from
# then to branch mma6, whose probes are mma_lean_qs .. mma_lean_qsup (pingpong 12-15; mma_lean_qs the default since).
# Every layout here runs the mma.sync path's merge (cuda_backend.DEFAULT_COMBINE: 7 since the spread2 run at 0117714,
# 4 from b44f69a, and merge 3, since retired, before it: the records' labels say comb7 / comb4 / comb3).
MMA_LAYOUTS = {name: (col_warps, 4, DEFAULT_COMBINE, pingpong) for name, (col_warps, pingpong) in {
    "mma_wide2pp": (16, True), "mma_wide2pp2": (16, 2), "mma_wide2pp2_lean": (16, 3), "mma_x16pp": (32, True),
    "mma_x16": (32, False),
    # the probes of branch mma4 (kdengine.ops.cuda_backend.PINGPONGS 4-8)
    "mma_lean_all": (16, 4), "mma_lean_kx2": (16, 5), "mma_lean_fast": (16, 6), "mma_lean_late": (16, 7),
    "mma_lean_v5": (16, 8), "mma_lean_short": (16, 9), "mma_lean_v4": (16, 10), "mma_lean_v4k": (16, 11),
    # the probes of branch mma6 (PINGPONGS 12-15: the default with Q staged through shared memory, 12 and 13; the
    # page-table row pointer warp-uniform, 14; both, 15)
    "mma_lean_qs": (16, 12), "mma_lean_qs2": (16, 13), "mma_lean_up": (16, 14), "mma_lean_qsup": (16, 15)}.items()}
# the `mma4` set: at 64-row blocks (T * H > 32) the default, the default again (A/A) and these; at 32-row blocks
# (T * H <= 32, T = 1, 2, 4 at H = 8: --trees) the default (wide2pp2 there), the default again and the lean form
# (those equal to the default left out: since 896dc1b (perf_history/kernel/verify_kernel_mma4_*_896dc1b.json) the
# default is mma_lean_v5, and the previous default, mma_wide2pp2_lean, takes its row)
MMA4_LAYOUTS = ("mma_wide2pp2_lean", "mma_lean_kx2", "mma_lean_fast", "mma_lean_late", "mma_lean_short", "mma_lean_v5",
                "mma_lean_v4", "mma_lean_v4k")
MMA4_SMALL_LAYOUTS = ("mma_lean_all",)
# the `mma6` set (branch mma6, ci/gpu/mma6.sh): the default, the default again (A/A) and these at 64-row blocks (at
# 32-row blocks the probes run wide2pp2, as the default does: only the default and its A/A row there); the one equal to
# the default is left out (run 0c41cd6 timed them with mma_lean_v5 the default; mma_lean_qs is the default since)
MMA6_LAYOUTS = ("mma_lean_v5", "mma_lean_qs", "mma_lean_qs2", "mma_lean_up", "mma_lean_qsup")
# Retired sets: `mma7` (e1a18c1, a page-64 probe: perf_history/kernel/mma7_e1a18c1/) and `mma8` (e949c85, pingpongs
# 16 / 17 with a quarter / none of P*V beside Q*K^T, mma_lean_pvq / mma_lean_pv0: even with the default,
# perf_history/kernel/mma8_e949c85/); their probes are gone from the kernel.
# the layouts the `mma2` set times beside the default: the previous default (wide2pp2, ping-pong 2). Its runs so far:
# 2e1c440 (default pingpong 1; mma_x16pp at auto and fixed NSPLIT, mma_x16), 4c2df52 (default pingpong 1;
# mma_wide2pp2 at auto and fixed NSPLIT, which then became the default), a987463 (default pingpong 2;
# mma_wide2pp2_lean, which then became the default: ci/gpu/mma3.sh, retired: ci/gpu/README.md); since 896dc1b (branch mma4: ci/gpu/mma4.sh, retired, set
# `mma4`) the default is mma_lean_v5 and the previous default, the lean form, is timed beside it
MMA2_LAYOUTS = ("mma_wide2pp2_lean",)
# The sm90 path's rows: backend name -> schedule (kdengine.ops.cuda_backend.SCHEDULES). (In the first
# record, perf_history/kernel/verify_kernel_sm90_*_ebda896.json, "cuda_sm90" was the seesaw schedule.)
SM90_BACKENDS = {"cuda_sm90_both": "both", "cuda_sm90_staggered": "staggered", "cuda_sm90_seesaw": "seesaw",
                 "cuda_sm90_pair": "pair", "cuda_sm90_half": "half", "cuda_sm90_staggered_small": "staggered_small",
                 "cuda_sm90_staggered_tail": "staggered_tail", "cuda_sm90_seesaw2": "seesaw2",
                 "cuda_sm90_seesaw2_bar": "seesaw2_bar", "cuda_sm90_seesaw2_el": "seesaw2_el",
                 "cuda_sm90_dispatched": None}  # launch_sm90's own pick (cuda_backend.pick_schedule)
# Short device-run sets of sm90 schedules: (the schedules timed, the baseline first; whether the baseline is
# timed again after them as the run's A/A control).
SM90_SETS = {"pair": (("staggered", "pair"), False), "half": (("staggered", "half"), True),
             "icache": (("staggered", "staggered_small", "staggered_tail"), True),
             "seesaw2": (("staggered_small", "seesaw2", "seesaw2_bar"), True)}


def merge_abba(a: int, b: int) -> tuple:
    """Merges a, b, b again, a again as (combine, tag) rows, the second pair tagged /aa (the A/A rows)."""
    return (a, ""), (b, ""), (b, "/aa"), (a, "/aa")


# merge 4, 7, 7 again, 4 again: the `spread` set's order, and ci/gpu/merge_ab.py's default
MERGE_ABBA = merge_abba(4, 7)
H = 8
SAMPLES = 50  # = kdengine.bench.workloads.GPU_VERIFY_SAMPLES
SCHEMA = 2

# --- launchers ----------------------------------------------------------------------------------------


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
        return torch.einsum("thn,nd->thd", probs, kv[:, :DV])

    return call


def default_layout():
    from kdengine.ops import cuda_backend

    return (cuda_backend.DEFAULT_COL_WARPS, cuda_backend.DEFAULT_ROW_GROUPS, cuda_backend.DEFAULT_COMBINE,
            cuda_backend.DEFAULT_PINGPONG)


def mma_layout(name: str | None = None, combine: int | None = None) -> tuple:
    """The mma.sync layout `name` (MMA_LAYOUTS; anything else, such as None or "mma": the default) with its merge
    replaced by `combine` when given."""
    cw, rg, comb, pp = MMA_LAYOUTS.get(name, default_layout())
    return (cw, rg, comb if combine is None else combine, pp)


def launcher(name: str, inp, bits, nsplit, *, scalar_loads: bool = False, layout=None):
    """(call, nsplit used, result) for one backend on one input set: call() launches, result() the output."""
    if name == "cuda_auto":  # the call verify/cuda times (verify_timing.suite_call): the backend's own path choice
        # (auto) and NSPLIT; its output is not kept, the check runs one more call after the timing
        from kdengine.ops import cuda_backend

        _, splits = cuda_backend.plan(inp.q, inp.kv_cache, inp.page_table, nsplit)
        fn = verify_timing.suite_call("cuda", nsplit)
        return (lambda: fn(inp, bits)), splits, (lambda: fn(inp, bits))
    if name == "cuda":
        from kdengine.ops import cuda_backend

        # layout: (col_warps, row_groups, combine, pingpong[, merge_early])
        cw, rg, combine, pp, *early = layout or default_layout()
        splits = cuda_backend.plan_nsplit(inp.q, inp.kv_cache, inp.page_table, nsplit, rg, cw, pp)
        out, lse = cuda_backend.alloc_outputs(inp.q)
        args = (inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, out, lse)
        call = lambda: cuda_backend.launch(*args, sm_scale=inp.sm_scale, nsplit=splits, scalar_loads=scalar_loads,
                                           col_warps=cw, row_groups=rg, combine=combine, pingpong=pp,
                                           merge_early=early[0] if early else None)
        return call, splits, lambda: out
    if name in SM90_BACKENDS:  # the Hopper wgmma path, one schedule of its two consumer warpgroups
        from kdengine.ops import cuda_backend

        # layout: a dict {"combine": c} (launch_sm90's), or an mma layout of which only the merge applies
        opts = layout if isinstance(layout, dict) else {"combine": layout[2] if layout else None}
        combine = opts.get("combine")
        splits = cuda_backend.plan_nsplit_sm90(inp.q, inp.kv_cache, inp.page_table, nsplit)
        out, lse = cuda_backend.alloc_outputs(inp.q)
        args = (inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, out, lse)
        call = lambda: cuda_backend.launch_sm90(*args, sm_scale=inp.sm_scale, nsplit=splits,
                                                schedule=SM90_BACKENDS[name], combine=combine,
                                                merge_early=opts.get("merge_early"))
        return call, splits, lambda: out
    result = {}
    if name == "torch":
        fn = torch_unfused(inp, bits, int(inp.prefix_len[0]) + inp.q.shape[1])
    elif name in peers.PEERS:
        reason = peers.unavailable_reason(name, inp.q.device)
        if reason is not None:
            raise RuntimeError(reason)
        fn = peers.flashmla_call(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, sm_scale=inp.sm_scale)
    else:
        module = importlib.import_module(f"kdengine.ops.{ {'triton': 'triton_verify', 'triton_extend': 'triton_extend'}[name] }")
        reason = module.available(inp.q.device)
        if reason is not None:
            raise RuntimeError(reason)
        fn = lambda: module.run(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, sm_scale=inp.sm_scale,
                                nsplit=nsplit, return_lse=False)[0]

    def call():
        result["out"] = fn()

    return call, nsplit, lambda: result["out"]


def rotating_call(name: str, nsplit, *, scalar_loads: bool = False, layout=None):
    """verify_timing's call(inp, bits): one launcher per input set, made on first use."""
    made: dict[int, tuple] = {}

    def call(inp, bits):
        if id(inp) not in made:
            made[id(inp)] = launcher(name, inp, bits, nsplit, scalar_loads=scalar_loads, layout=layout)
        return made[id(inp)][0]()

    return call, made


# --- the sweep ----------------------------------------------------------------------------------------


PP_LABELS = {2: "2", 3: "2lean", 4: "2leanall", 5: "2leankx2", 6: "2leanfast", 7: "2leanlate", 8: "2leanv5",
             9: "2leanshort", 10: "2leanv4", 11: "2leanv4k", 12: "2leanqs", 13: "2leanqs2",
             14: "2leanup", 15: "2leanqsup"}


def layout_label(cw, rg, comb, pp) -> str:
    return f"cw{cw}rg{rg}" + (f"/comb{comb}" if comb else "") + ("/pp" if pp else "") + PP_LABELS.get(int(pp), "")


def named_layout_rows(names) -> list:
    """The variant rows (auto NSPLIT) of the MMA_LAYOUTS `names`, less any equal to the default layout (its own row)."""
    return [(f"cuda/{layout_label(*MMA_LAYOUTS[n])}/sauto", "cuda", "auto", False, MMA_LAYOUTS[n])
            for n in names if MMA_LAYOUTS[n] != default_layout()]


def default_label() -> str:
    """The row of the mma.sync default (auto NSPLIT, default layout): what verify/cuda/... times off Hopper."""
    return f"cuda/{layout_label(*default_layout())}/sauto"


# the row timing cuda_backend.run as the verify/cuda benchmarks call it (path auto: the sm90 kernel on Hopper,
# mma.sync elsewhere): the "ours" of every ours / FlashMLA ratio
DISPATCH = "cuda"
# the `merge` set's two rows: the dispatched sm90 call with its merge, and its split kernel alone
MERGE_ROW, SPLIT_ONLY_ROW = "cuda_sm90_dispatched/c0/sauto", "cuda_sm90_dispatched/c0/splitonly/sauto"


def nsplit_grid(*, tokens: int, tile_tokens: int, row_tiles: int, wave_blocks: int, auto: int, most: int = 9) -> list:
    """Fixed split counts to time beside `auto` (the `nsplit2` set): the counts of non-empty splits a kernel that
    gives each split whole tiles can run (ceil(tiles / k) for k tiles a split), from auto / 4 up to one wave of
    blocks (row_tiles blocks a split, wave_blocks resident at once), thinned to about `most` evenly spaced on a log
    scale; auto's nearest count on either side is always kept, auto itself never (it has its own rows)."""
    tiles = -(-tokens // tile_tokens)
    low, top = max(1, auto // 4), max(1, wave_blocks // max(1, row_tiles))
    counts = sorted(n for n in {-(-tiles // k) for k in range(1, tiles + 1)} if low <= n <= top and n != auto)
    if not counts:
        return []
    keep = {max((n for n in counts if n < auto), default=None), min((n for n in counts if n > auto), default=None)}
    for i in range(most):
        target = low * (top / low) ** (i / max(1, most - 1))
        keep.add(min(counts, key=lambda n: (abs(n - target), n)))
    return sorted(n for n in keep if n is not None)


def nsplit2_rows(N: int, T: int) -> list:
    """The `nsplit2` set at one size: per cuda path (the sm90 kernel on Hopper, the mma.sync default everywhere),
    its planner's NSPLIT (auto) first, then fixed counts from nsplit_grid, then auto again (its A/A control)."""
    from kdengine.ops import cuda_backend, schedule

    sms = schedule.sm_count(torch.cuda.current_device() if torch.cuda.is_available() else None)
    cw, rg, _, pp = lay = default_layout()
    paths = []
    if hopper():
        paths.append(("cuda_sm90_dispatched", "cuda_sm90_dispatched", None, cuda_backend.split_shape_sm90(T, H)))
    paths.append((f"cuda/{layout_label(*lay)}", "cuda", lay,
                  cuda_backend.split_shape_mma(T, H, rg, cw, pp, torch.cuda.is_available())))
    rows = []
    for label, backend, layout, shape in paths:  # the grid around what that path's planner gives (its own inputs)
        auto = schedule.auto_nsplit(capacity=N, batch=1, num_sms=sms, **shape)
        grid = nsplit_grid(tokens=N, tile_tokens=shape["tile_tokens"], row_tiles=shape["row_tiles"], wave_blocks=sms,
                           auto=auto)
        rows.append((f"{label}/sauto", backend, "auto", False, layout))
        rows += [(f"{label}/s{n}", backend, n, False, layout) for n in grid]
        rows.append((f"{label}/aa/sauto", backend, "auto", False, layout))
    return rows


def nsplit2_pairs(doc: dict):
    """Per size and path of an `nsplit2` record: (case, path label, auto row, auto-again row, fastest fixed row, the
    mean of the two auto rows over that fastest one); a path without both auto rows or any fixed row is left out."""
    for case in doc["cases"]:
        res = {k: v for k, v in case["results"].items() if v and "median_s" in v}
        for base in sorted({k.rsplit("/", 1)[0].removesuffix("/aa") for k in res}):
            a, a2 = res.get(f"{base}/sauto"), res.get(f"{base}/aa/sauto")
            fixed = [v for k, v in res.items() if k.startswith(base + "/s") and not k.endswith("/sauto")]
            if not (a and a2 and fixed):
                continue
            best = min(fixed, key=lambda v: v["median_s"])
            yield case, base, a, a2, best, (a["median_s"] + a2["median_s"]) / 2 / best["median_s"]


def nsplit2_table(doc: dict, tolerance: float = 0.03) -> list:
    """Markdown lines from an `nsplit2` record: per size and path, auto (the mean of its two rows) against the fastest
    fixed count, the A/A pair's spread, and whether auto is within `tolerance` of that best."""
    lines = ["| size | path | auto (n) | auto again | best fixed (n) | auto / best | within |",
             "|---|---|---|---|---|---|---|"]
    for case, base, a, a2, best, ratio in nsplit2_pairs(doc):
        lines.append(f"| {case['N'] // 1000}k T{case['T']} | {base} | {a['median_s'] * 1e6:.2f} ({a['nsplit']}) | "
                     f"{a2['median_s'] * 1e6:.2f} | {best['median_s'] * 1e6:.2f} ({best['nsplit']}) | {ratio:.3f} | "
                     f"{'yes' if ratio <= 1 + tolerance else 'NO'} |")
    return lines


def hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


def variants(N: int, T: int, which: str = "full"):
    """(label, backend, nsplit, scalar_loads, layout) measured at one size. `peers`: the cuda default,
    triton, the unfused torch composition and the peers. `mma`: the wide2 layout (streaming loads, lazy
    rescaling) with ping-pong halves and its 16-warp form (32) at several NSPLIT, both at the automatic
    NSPLIT with each parallel merge, beside the wide layout, the cuda default and the peers. `full` adds
    every NSPLIT for the default (wide2, ping-pong, merge 2) and for the wide layout (64 rows per block,
    parallel merge) with and without ping-pong halves, the wide layout at 32 rows, the 2-warp layout
    with the serial merge, the 2-warp layout with the parallel merge and the wide layout's scalar-load
    build at the automatic NSPLIT, and triton_extend at 65k T=16. `paths`: the defaults of both cuda
    paths (the sm90 kernel on Hopper), each also with the chunked merge, and the peers. `pair`: the sm90
    staggered and pair schedules and the peers only. `half`: staggered, half, staggered again (the A/A
    control: its spread against the first bounds what a difference means) and the peers (the records of
    f59d68d and 45ed1b3 also hold the probes half_v0, staggered_er and half_fa3, since removed). `icache`:
    staggered, staggered_small (its hot loop shrunk for instruction fetch), staggered_tail (only the tail
    mask rolled: the same math), staggered again (A/A), the peers. `seesaw2`: staggered_small, seesaw2
    (FlashMLA's order in our layout), seesaw2_bar (its hand-offs on named barriers), staggered_small again (A/A),
    the peers. `merge`: the sm90 schedule the dispatched
    call picks (cuda_backend.pick_schedule) with and without the merge. `pdl`: that call with the merge let launch
    at the split kernel's start and before its partial writes (cuda_backend.DEFAULT_MERGE_EARLY's two values), the
    split kernel alone, the default again (A/A), then the mma.sync default likewise (DEFAULT_MMA_MERGE_EARLY)."""
    base = [(default_label(), "cuda", "auto", False, None), ("triton", "triton", None, False, None),
            ("torch", "torch", None, False, None)] + [(p, p, None, False, None) for p in peers.PEERS]
    if which == "peers":  # the dispatched call (the sm90 kernel on Hopper) beside the mma.sync default
        return [(DISPATCH, "cuda_auto", "auto", False, None), *base]
    if which == "paths":  # both cuda paths' defaults (mma.sync; sm90 on Hopper) and each with the chunked
        # merge (combine 2, the previous default), beside the peers
        cw, rg, _, pp = default_layout()
        chunked = (cw, rg, 2, pp)
        mma = [base[0], (f"cuda/{layout_label(*chunked)}/sauto", "cuda", "auto", False, chunked)]
        sm90 = [("cuda_sm90_staggered/sauto", "cuda_sm90_staggered", "auto", False, None),
                ("cuda_sm90_staggered/comb2/sauto", "cuda_sm90_staggered", "auto", False, chunked)] if hopper() else []
        return [*mma, *sm90, *base[3:]]
    if which == "mma":  # the mma.sync layouts: wide2 (16) at several NSPLIT, merges and row tilings, the wide
        # layout with both parallel merges (the default row is appended below), the peers
        lays = [((32, 4, 2, False), (16, 32, 64, 128, "auto")), ((16, 4, 2, True), (16, 32, 64, 128, "auto")),
                ((16, 4, 2, False), ("auto",)), ((16, 4, 1, False), ("auto",)), ((32, 4, 1, False), ("auto",)),
                ((8, 4, 2, False), ("auto",))]
        out = [(f"cuda/{layout_label(*lay)}/s{s}", "cuda", s, False, lay) for lay, splits in lays for s in splits]
        return [v for v in out if v[0] != default_label()] + [base[0]] + base[3:]
    if which == "mma2":  # the mma.sync default, the same again as an A/A control, the default at fixed NSPLIT
        # (is its auto within 3% of the best?), the MMA2_LAYOUTS, FlashMLA
        default = default_layout()
        rows = [base[0], (f"{base[0][0]}/aa", "cuda", "auto", False, None)]
        rows += [(f"cuda/{layout_label(*default)}/s{sp}", "cuda", sp, False, default) for sp in (16, 32, 64, 128)]
        return rows + named_layout_rows(MMA2_LAYOUTS) + base[3:]
    if which == "mma4":  # the mma.sync default, the same again as an A/A control, the probes of branch mma4
        names = MMA4_SMALL_LAYOUTS if T * H <= 32 else MMA4_LAYOUTS
        rows = [base[0], (f"{base[0][0]}/aa", "cuda", "auto", False, None)]
        return rows + named_layout_rows(names)
    if which == "mma6":  # the mma.sync default, the same again as an A/A control, the probes of branch mma6
        rows = [base[0], (f"{base[0][0]}/aa", "cuda", "auto", False, None)]
        return rows + ([] if T * H <= 32 else named_layout_rows(MMA6_LAYOUTS))
    if which == "nsplit2":  # both cuda paths at fixed split counts (a finer grid) between two auto rows
        return nsplit2_rows(N, T)
    if which == "nsplit":  # the dispatched call at fixed split counts beside its own planner (auto)
        return [(f"{DISPATCH}/s{sp}", "cuda_auto", sp, False, None) for sp in NSPLITS if sp != "auto"] + [
            (DISPATCH, "cuda_auto", "auto", False, None)]
    if which == "sm90":  # the Hopper path against the mma.sync default and FlashMLA
        sm90 = [(f"{name}/sauto", name, "auto", False, None) for name in SM90_BACKENDS]
        sm90 += [(f"cuda_sm90_staggered/s{sp}", "cuda_sm90_staggered", sp, False, None) for sp in (32, 128)]
        return [base[0], *sm90, *[(p, p, None, False, None) for p in peers.PEERS]]
    if which == "merge":  # the merge kernel after the split kernel, and absent (timing only)
        from kdengine.ops import cuda_backend

        sched = "cuda_sm90_dispatched"  # the schedule launch_sm90 picks for the call (rows and tiles per split)
        return [(MERGE_ROW, sched, "auto", False, {}),
                (SPLIT_ONLY_ROW, sched, "auto", False, {"combine": cuda_backend.SPLIT_ONLY})]
    if which == "spread":  # the grouped merge (4) against 7 (its blocks spread over the SMs: the mma.sync path's since the
        # run at 0117714, the sm90 path's since ci/gpu/merge_ab.py's), A B B A on each path (at 591e4a6 the mma.sync rows
        # were 4, 7)
        sched = "cuda_sm90_dispatched"
        sm90 = [(f"{sched}/c{c}{tag}/sauto", sched, "auto", False, {"combine": c})
                for c, tag in MERGE_ABBA] if hopper() else []
        mma = [(f"cuda/{layout_label(*lay)}{tag}/sauto", "cuda", "auto", False, lay)
               for c, tag in MERGE_ABBA for lay in (mma_layout(combine=c),)]
        return sm90 + mma + [(p, p, None, False, None) for p in peers.PEERS]
    if which == "pdl":  # when the split kernel lets the merge launch: the default, the other choice, the split kernel
        # alone (the merge's share; sm90), the default again (A/A); the sm90 kernel on Hopper, then the mma.sync default
        from kdengine.ops import cuda_backend

        sched, default = "cuda_sm90_dispatched", cuda_backend.DEFAULT_MERGE_EARLY
        sm90 = [(f"{sched}/early{int(default)}/sauto", sched, "auto", False, {}),
                (f"{sched}/early{int(not default)}/sauto", sched, "auto", False, {"merge_early": not default}),
                (f"{sched}/splitonly/sauto", sched, "auto", False, {"combine": cuda_backend.SPLIT_ONLY}),
                (f"{sched}/early{int(default)}/aa/sauto", sched, "auto", False, {})] if hopper() else []
        mma, early = default_layout(), cuda_backend.DEFAULT_MMA_MERGE_EARLY
        label = default_label().removesuffix("/sauto")
        return sm90 + [(f"{label}/early{int(early)}/sauto", "cuda", "auto", False, mma),
                       (f"{label}/early{int(not early)}/sauto", "cuda", "auto", False, (*mma, not early)),
                       (f"{label}/early{int(early)}/aa/sauto", "cuda", "auto", False, mma)]
    if which in SM90_SETS:  # sm90 schedules against a baseline (and the baseline again: the A/A control), the peers
        names, aa = SM90_SETS[which]
        rows = [(f"cuda_sm90_{n}/sauto", f"cuda_sm90_{n}", "auto", False, None) for n in names]
        if aa:
            rows.append((f"cuda_sm90_{names[0]}/aa/sauto", f"cuda_sm90_{names[0]}", "auto", False, None))
        return rows + [(p, p, None, False, None) for p in peers.PEERS]
    short = NSPLITS[:4] + ("auto",)
    sweeps = (((16, 4, 2, True), NSPLITS), ((8, 4, 1, False), NSPLITS), ((8, 4, 1, True), NSPLITS),
              ((8, 2, 1, True), short), ((2, 4, 0, False), short))
    out = [(f"cuda/{layout_label(*lay)}/s{s}", "cuda", s, False, lay) for lay, splits in sweeps for s in splits]
    out += [("cuda/cw8rg2/comb1/sauto", "cuda", "auto", False, (8, 2, 1, False))]
    out += [("cuda/cw2rg4/comb1/sauto", "cuda", "auto", False, (2, 4, 1, False))]
    out += [("cuda_scalar/cw8rg4/comb1/sauto", "cuda", "auto", True, (8, 4, 1, False))]
    out = [v for v in out if v[0] != default_label()] + base
    if (N, T) == (65536, 16):
        out.append(("triton_extend", "triton_extend", None, False, None))
    if (N, T) == (65536, 64):  # one wave (16 x 8 programs) against one program past it (17 x 8)
        out += [(f"triton/s{s}", "triton", s, False, None) for s in (16, 17)]
    return out


ORDERS = ("sequential", "interleaved")


def measure_case(N: int, T: int, ceil: roofline.Ceilings, which: str = "full", samples: int = SAMPLES,
                 order: str = "sequential", gap_ms: float = verify_timing.GAP_S * 1e3) -> dict:
    """Every variant of one size, timed on the same input sets. order "sequential" (the default): each
    variant's samples in one block, one after another, as the suite's front ends (asv, pytest-benchmark,
    `kdengine bench`) take them, so the figures agree with theirs; "interleaved": the variants' samples
    round by round (verify_timing.time_verify_many), so a drift of the GPU over the set falls on all alike.
    gap_ms: the GPU spins about that long after each sample (verify_timing.GAP_S). The position effect of
    the records before these options was the power cap, which the spin keeps off (at 65k T=64 on the H200,
    0% of any row's span capped in either order: perf_history/kernel/order_e8ba5e7/, final_e2a43f3/).
    Interleaved reads some kernels slower than sequential with the same gap, by up to 4% at T=16 (FlashMLA
    at 65k: 54.4 against 52.4 us; seesaw2 at 16k: 21.5 against 20.9; final_e2a43f3/seesaw2{,seq}.log):
    the kernel changes between samples (not L2 residue: a flush of 8x the L2 reads the same,
    perf_history/kernel/flush_probe_e160d03/). A variant that cannot be built or run is recorded as an error, not
    fatal."""
    from kdengine.bench import fingerprint as fp
    from kdengine.ops.inputs import rel_l2
    from kdengine.ops.reference import verify_attention_reference

    if order not in ORDERS:
        raise ValueError(f"order: expected one of {ORDERS}, got {order!r}")
    sets = {chain: verify_timing.input_sets(N=N, T=T, H=H, chain=chain) for chain in (False, True)}
    refs = {chain: verify_attention_reference(*s[0][0].args()[:4], s[0][1], sm_scale=s[0][0].sm_scale)[0]
            for chain, s in sets.items()}
    floor = roofline.verify_floor(N=N, T=T, H=H, ceil=ceil)
    rows, ready = {}, []

    def failed(label: str, exc: Exception) -> None:
        rows[label] = {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
        print(f"ctx{N} T{T} {label}: {rows[label]['error']}", flush=True)

    for label, backend, nsplit, scalar, layout in variants(N, T, which):
        chain = backend in peers.PEERS  # a peer applies a causal tail: checked against a chain mask
        try:  # build the launcher of every input set and run each once: a backend that cannot run fails here
            call, made = rotating_call(backend, nsplit, scalar_loads=scalar, layout=layout)
            for inp, bits in sets[chain]:
                call(inp, bits)
            if torch.cuda.is_available():
                torch.cuda.synchronize()
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            failed(label, exc)
            continue
        rows[label] = None  # keeps the variants' order
        ready.append((label, call, made, chain))
    timed = {}
    if order == "interleaved" and len(ready) > 1:
        print(f"ctx{N} T{T}: {len(ready)} variants, {samples} interleaved rounds", flush=True)
        try:
            ms = verify_timing.time_verify_many([(call, sets[chain]) for _, call, _, chain in ready], samples=samples,
                                                gap_s=gap_ms / 1e3)
            timed = {label: m for (label, *_), m in zip(ready, ms, strict=True)}
        except Exception as exc:  # noqa: BLE001 - one launch failed inside the rounds: time them one by one
            print(f"ctx{N} T{T}: interleaved timing failed ({type(exc).__name__}: {exc}); timing one by one",
                  flush=True)
    for label, call, made, chain in ready:
        try:
            m = timed.get(label) or verify_timing.time_verify(call, sets[chain], samples=samples, capturable=True,
                                                              gap_s=gap_ms / 1e3)
            _, splits, result = made[id(sets[chain][0][0])]
            err = rel_l2(result().reshape(refs[chain].shape), refs[chain])
        except Exception as exc:  # noqa: BLE001 - recorded, not fatal
            failed(label, exc)
            continue
        rows[label] = {"median_s": m.median, "samples": m.samples, "nsplit": splits, "rel_l2": err,
                       "floor_pct": 100 * floor / m.median, "throttled": m.throttled,
                       "capped_frac": fp.throttle_fraction(m.clocks_start, m.clocks_end), "copies": len(sets[chain]),
                       "launches_per_sample": m.launches_per_sample, "method": m.method, "order": order}
        print(f"ctx{N} T{T} {label:30s} nsplit={splits!s:5s} {m.median * 1e6:9.1f} us  "
              f"{100 * floor / m.median:5.1f}% of floor  relL2={err:.2e}", flush=True)
    return {"N": N, "T": T, "H": H, "floor_s": floor, "order": order, "gap_ms": gap_ms, "results": rows}


def fingerprint() -> dict:
    from kdengine.bench import fingerprint as fp

    info = fp.collect()
    info["clocks"] = fp.clocks()
    try:
        info["nvidia_smi"] = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.draw,temperature.gpu",
             "--format=csv"], capture_output=True, text=True, timeout=20).stdout.strip()
    except OSError:
        info["nvidia_smi"] = None
    return info


def measure(args) -> int:
    from dataclasses import asdict

    contexts = [int(c) for c in args.contexts.split(",")]
    start = fingerprint()
    if args.commit:  # the commit measured, said by the caller: a device copy's .git may be absent or stale
        from kdengine.bench.fingerprint import named_commit

        start = named_commit(start, args.commit)
    ceil = roofline.ceilings("cuda")
    print(f"ceilings: copy {ceil.copy_bytes_per_s / 1e12:.2f} TB/s (read + write), bf16 mm "
          f"{ceil.matmul_flops_per_s / 1e12:.0f} TF/s")
    doc = {"schema": SCHEMA, "kind": "verify_kernel_cudagraph", "set": args.set, "default_label": default_label(),
           "ours_label": DISPATCH if args.set == "peers" else default_label(),
           "date": dt.datetime.now(dt.timezone.utc).isoformat(),
           "method": "kdengine.bench.verify_timing: input sets whose KV exceeds 2x L2, K = max(8, sets) launches "
                     f"per CUDA-graph replay between CUDA events, L2 flushed before each of {SAMPLES} samples; "
                     f"a {args.gap_ms:g} ms spin after each; seconds per launch, median; "
                     + ("the variants of a size sampled round by round (interleaved)" if args.order == "interleaved"
                        else "each variant's samples in one block (sequential)"),
           "order": args.order, "gap_ms": args.gap_ms,
           "fingerprint": start, "clocks_end": None, "ceilings": asdict(ceil), "cases": []}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    for N in contexts:
        for T in [int(t) for t in args.trees.split(",")]:
            doc["cases"].append(measure_case(N, T, ceil, args.set, order=args.order, gap_ms=args.gap_ms))
            doc["clocks_end"] = fingerprint().get("clocks")
            Path(args.out).write_text(json.dumps(doc, indent=1))  # after every case: a cut-short run keeps its data
    print(f"wrote {args.out}")
    return 0


# --- rendering ----------------------------------------------------------------------------------------


def _ours_label(doc: dict, results: dict) -> str | None:
    """The cuda default's row of a case (schema 2 names it; schema 1: the wide layout at auto)."""
    for label in (doc.get("ours_label"), doc.get("default_label"), "cuda/cw8rg4/comb1/sauto"):
        if label and label in results and "median_s" in results[label]:
            return label
    return None


def peer_lines(doc: dict) -> list[str]:
    """ours / peer per size (time over time, below 1: ours is faster), for the cuda default and triton."""
    medians = {}
    for case in doc["cases"]:
        res, size = case["results"], f"ctx{case['N']}/T{case['T']}"
        ours = _ours_label(doc, res)
        if ours:
            medians[f"verify/cuda/{size}"] = res[ours]["median_s"]
        if "median_s" in res.get("triton", {}):
            medians[f"verify/triton/{size}"] = res["triton"]["median_s"]
        for p in peers.PEERS:
            if "median_s" in res.get(p, {}):
                medians[f"verify-peer/{p}/{size}"] = res[p]["median_s"]
    return peers.ratio_lines(medians)


def _state(row: dict) -> str:
    """A row's mark when its span was throttled (the timer's flag) and how much of it NVML counted capped."""
    capped = row.get("capped_frac")
    marks = (["throttled"] if row.get("throttled") else []) + (
        [f"capped {100 * capped:.0f}%"] if capped is not None and capped > 0.005 else [])
    return f"  ({', '.join(marks)})" if marks else ""


def render_doc(doc: dict) -> str:
    fp = doc["fingerprint"]
    ceil = doc["ceilings"]
    how = (f" ({ceil['method']})" if ceil.get("method") else
           " (schema 1: the copy timed as a CUDA-graph replay)")
    lines = [
        f"verify attention kernel, per layer (H={doc['cases'][0]['H'] if doc['cases'] else H}, B=1, page 64), "
        f"{doc['method']}",
        f"GPU {fp.get('gpu')} ({fp.get('sm_count')} SMs, {fp.get('capability')}), torch {fp.get('torch')}, "
        f"triton {fp.get('triton')}, CUDA {fp.get('cuda')}, commit {str(fp.get('commit'))[:10]}"
        f"{' (dirty)' if fp.get('dirty') and 'git_head' not in fp else ''}, {doc['date'][:19]}",
        f"ceilings measured: copy {ceil['copy_bytes_per_s'] / 1e12:.2f} TB/s read + write{how}, bf16 matmul "
        f"{ceil['matmul_flops_per_s'] / 1e12:.0f} TF/s; floor = max(bytes/copy, flops/matmul)",
        "",
        f"{'ctx':>6} {'T':>3}  {'backend':30s} {'nsplit':>6} {'median us':>10} {'tok/s':>10} {'% floor':>8} "
        f"{'x extend':>9} {'x torch':>8} {'/flashmla':>9}",
    ]
    for case in doc["cases"]:
        res = case["results"]
        ext = res.get("triton_extend", {}).get("median_s")
        torch_s = res.get("torch", {}).get("median_s")
        peer_s = res.get("flashmla", {}).get("median_s")
        for label, row in res.items():
            if "error" in row:
                lines.append(f"{case['N']:>6} {case['T']:>3}  {label:30s} unavailable: {row['error'][:60]}")
                continue
            t = row["median_s"]
            x_ext = f"{ext / t:9.1f}" if ext else f"{'-':>9}"
            x_torch = f"{torch_s / t:8.1f}" if torch_s else f"{'-':>8}"
            x_peer = f"{t / peer_s:9.2f}" if peer_s else f"{'-':>9}"
            lines.append(f"{case['N']:>6} {case['T']:>3}  {label:30s} {row['nsplit']!s:>6} {t * 1e6:10.1f} "
                         f"{case['T'] / t:10.0f} {row['floor_pct']:8.1f} {x_ext} {x_torch} {x_peer}{_state(row)}")
        lines.append("")
    extra = peer_lines(doc)
    if doc.get("set") == "nsplit2":
        extra = extra + ["auto NSPLIT against the best fixed count (the mean of the two auto rows):", "",
                         *nsplit2_table(doc)]
    return "\n".join(lines + (extra + [""] if extra else []))


def render(args) -> int:
    docs = [json.loads(Path(p).read_text()) for p in args.inputs]
    text = "\n\n".join(render_doc(d) for d in sorted(docs, key=lambda d: d["date"]))
    text = "# generated by `python -m kdengine.bench.kernel render` from perf_history/kernel/*.json\n" + text
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(text + "\n")
    print(text)
    return 0


def once(args) -> int:
    """One checked cuda call (for compute-sanitizer and ncu)."""
    if args.path is not None and (args.pingpong is not None or args.col_warps is not None):
        print("once: --pingpong / --col-warps give a layout of their own; with --path (which names one) they would be "
              "ignored: pass one or the other (--combine applies to either)", file=sys.stderr)
        return 2
    from kdengine.ops import cuda_backend
    from kdengine.ops.inputs import make_verify_inputs, rel_l2
    from kdengine.ops.mask import pack_tree_mask
    from kdengine.ops.verify import verify_attention

    inp = make_verify_inputs(B=args.B, T=args.T, H=args.H, prefix=args.prefix, page_size=args.page_size, seed=1,
                             device="cuda")
    if args.path is not None:  # the mma.sync default or a named mma layout, or the sm90 kernel (--combine)
        mma = args.path == "mma" or args.path in MMA_LAYOUTS
        layout = mma_layout(args.path, args.combine) if mma else {"combine": args.combine}
        call, _, result = launcher("cuda" if mma else f"cuda_{args.path}",
                                   inp, pack_tree_mask(inp.tree_mask), args.nsplit, layout=layout)
        call()
        out = result()
    elif args.pingpong is None and args.col_warps is None and args.combine is None:
        out = verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="cuda", nsplit=args.nsplit)
    else:  # a given layout (the wide one unless --col-warps), whatever the default
        cw = cuda_backend.WIDE if args.col_warps is None else args.col_warps
        combine = cuda_backend.DEFAULT_COMBINE if args.combine is None else args.combine
        call, _, result = launcher("cuda", inp, pack_tree_mask(inp.tree_mask), args.nsplit,
                                   layout=(cw, cuda_backend.DEFAULT_ROW_GROUPS, combine, int(args.pingpong or 0)))
        call()
        out = result()
    ref = verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="reference")
    err = rel_l2(out, ref)
    print(f"once B={args.B} T={args.T} H={args.H} prefix={args.prefix}: rel L2 {err:.2e}")
    return 0 if err < 1e-2 else 1


def _milliseconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected milliseconds, got {text!r}") from None
    if not value >= 0:  # also NaN
        raise argparse.ArgumentTypeError(f"expected milliseconds >= 0, got {text!r}")
    return value


def build_parser(prog: str = "python -m kdengine.bench.kernel") -> argparse.ArgumentParser:
    from kdengine.ops import cuda_backend

    parser = argparse.ArgumentParser(prog=prog)
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("measure")
    p.add_argument("--out", required=True)
    p.add_argument("--contexts", default=",".join(map(str, CONTEXTS)))
    p.add_argument("--trees", default=",".join(map(str, TREE_SIZES)), help="tree sizes T (comma-separated)")
    p.add_argument("--set", choices=SETS, default="full",
                   help="full: every layout and NSPLIT; peers: the dispatched cuda call (what verify/cuda "
                        "times), the mma.sync default, triton, torch, the peers; mma / sm90: one path's "
                        "variants; paths: both cuda paths' defaults, each with the chunked merge, and the "
                        "peers; nsplit: the dispatched call at fixed NSPLIT beside auto; nsplit2: both cuda paths at "
                        "a finer grid of fixed split counts between two auto rows (render adds auto / best)")
    p.add_argument("--order", choices=ORDERS, default="sequential",
                   help="sequential (default): each variant's samples in one block, as asv, pytest-benchmark and "
                        "kdengine bench take them; interleaved: the variants of a size take their samples round by "
                        "round, so a drift of the GPU over the set falls on all alike (up to 4%% slower at T=16: "
                        "the kernel changes between samples)")
    p.add_argument("--gap-ms", type=_milliseconds, default=verify_timing.GAP_S * 1e3,
                   help="the GPU spins about this long after each sample (busy, so its clock does not park; low "
                        "power, so the power cap back-to-back heavy samples reach stays off); 0: none")
    p.add_argument("--commit", default=None,
                   help="the commit measured (wins over the tree's .git, whose reading is kept as git_head / git_dirty; "
                        "dirty is then null: device copies of a tree clean at that commit)")
    p.set_defaults(func=measure)
    p = sub.add_parser("render")
    p.add_argument("inputs", nargs="+")
    p.add_argument("--out", default=None, help="also write the table here (the records file is ci record's)")
    p.set_defaults(func=render)
    p = sub.add_parser("once")
    for name, default in (("B", 1), ("T", 16), ("H", 8), ("prefix", 300)):
        p.add_argument(f"--{name}", type=int, default=default)
    p.add_argument("--nsplit", type=int, default=None)
    p.add_argument("--page-size", type=int, default=64)
    p.add_argument("--pingpong", type=int, choices=cuda_backend.PINGPONGS, default=None,
                   help="ping-pong halves (1; 2: P*V split around the barrier, wide2 only; 3: the same, lean; 4-15: "
                        "the lean probes, cuda_backend.PINGPONGS) or not (0) for the wide "
                        "layouts; with --col-warps / --combine: that layout instead of the default")
    p.add_argument("--col-warps", type=int, default=None, help="the layout (cuda_backend.COL_WARPS)")
    p.add_argument("--combine", type=int, default=None, help="the merge (cuda_backend.COMBINES)")
    p.add_argument("--path", choices=("mma", *MMA_LAYOUTS, *(name.removeprefix("cuda_") for name in SM90_BACKENDS)),
                   default=None, help="force the cuda split kernel: mma.sync (its default or a named layout, "
                                      "MMA_LAYOUTS), or the sm90 wgmma kernel with one schedule")
    p.set_defaults(func=once)
    return parser


def main(argv=None, prog: str = "python -m kdengine.bench.kernel") -> int:
    args = build_parser(prog).parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
