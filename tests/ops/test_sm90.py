"""The Hopper path of the CUDA verify kernel (csrc/verify_sm90.cuh: wgmma + TMA, warp-specialized).

CPU (nvcc): the sm_90a build holds wgmma for both products (S = Q K^T m64n64k16, m64n32k16 for half's
token halves; O += P V m64n256k16), TMA tile loads (cp.async.bulk.tensor) on mbarriers, setmaxnreg, no
register spills, and no wgmma serialized by ptxas in half; other arches get a stub without any of it. The path switch (argument, KDENGINE_CUDA_PATH, fallback) on the CPU.
GPU (sm_90 only): the same reference checks as tests/ops/test_cuda.py, outputs poisoned first, for
every schedule of the consumer warpgroups (both compute S / staggered / seesaw: they alternate / pair /
half: they split each tile's tokens), scores whose running max moves many times (half's lazy rescale), and
the dispatched call replayed from a CUDA graph at several lengths.
"""

from __future__ import annotations

import re
import subprocess
from functools import cache

import pytest
import torch

from kdengine.ops import build, cuda_backend
from kdengine.ops.mask import pack_tree_mask

from .ptx import SPILLS, kernel_bodies, unit_ptx
from .test_cuda import CONTRACT, ODD, TestParam, _check, _problem

SM90_SOURCE = build.CSRC / "verify_sm90.cu"


def compile_ptx(arch: str) -> str:
    return unit_ptx(SM90_SOURCE.name, arch)


@cache
def ptxas_report() -> str:
    cmd = ["nvcc", "-c", "-std=c++17", "-O3", "-Xptxas", "-v", "-gencode=arch=compute_90a,code=sm_90a",
           "-o", "/dev/null", str(SM90_SOURCE)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=180)
    return done.stdout + done.stderr


def kernel_name(schedule: str) -> str:
    """The kernel of a schedule as it appears in a mangled name (its template argument; a capped one's wrapper)."""
    wrapper = "verify_sm90_kernel_capped" if schedule in cuda_backend.REGISTER_CAPS else "verify_sm90_kernel"
    return f"{wrapper}ILi{cuda_backend.SCHEDULES[schedule]}E"


HALF_KERNEL = kernel_name("half")
SMALL_KERNELS = [kernel_name(s) for s in ("staggered_small", "staggered_tail")]
SEESAW2_BAR_KERNEL = kernel_name("seesaw2_bar")  # seesaw2's named-barrier form
SEESAW2_KERNELS = [kernel_name(s) for s in cuda_backend.SCHEDULES if s.startswith("seesaw2")]  # 256 threads, no producer


# --- CPU --------------------------------------------------------------------------------------------


@pytest.mark.nvcc
def test_sm90a_build_uses_wgmma_tma_and_setmaxnreg():
    bodies = kernel_bodies(compile_ptx("90a"))
    kernels = [b for name, b in bodies.items() if "verify_sm90_kernel" in name]
    assert len(kernels) == len(cuda_backend.SCHEDULES)
    for name, body in bodies.items():
        if "verify_sm90_kernel" not in name:
            continue
        s_shape = "m64n32k16" if HALF_KERNEL in name else "m64n64k16"  # half: S of 32 tokens per warpgroup
        assert f"wgmma.mma_async.sync.aligned.{s_shape}.f32.bf16.bf16" in body  # S = Q K^T
        assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in body  # O += P V
        assert "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes" in body
        assert "mbarrier.try_wait.parity" in body and "mbarrier.arrive.expect_tx" in body
        if any(k in name for k in SEESAW2_KERNELS):  # no producer warpgroup: nothing to hand registers to; Q's rope
            # chunk from registers
            assert "setmaxnreg" not in body
            assert re.search(r"wgmma\.mma_async\.sync\.aligned\.m64n64k16\.f32\.bf16\.bf16 \{[^}]*\}, \{", body)
            # seesaw2 hands data between its warpgroups on mbarriers only (racecheck does not model bar.arrive:
            # perf_history/kernel/s2race_6a95ae1/README.md); seesaw2_bar is the named-barrier form
            handoffs = re.findall(r"mbarrier\.arrive\.shared::cta\.b64", body)
            if SEESAW2_BAR_KERNEL in name:
                assert re.search(r"\bbar(rier)?\.arrive", body)
            else:  # seesaw2 and its probes
                assert not re.search(r"\bbar(rier)?\.arrive", body) and len(handoffs) == 5
        else:
            assert "setmaxnreg.dec.sync.aligned.u32" in body and "setmaxnreg.inc.sync.aligned.u32" in body
        assert "wgmma.wait_group.sync.aligned" in body
        assert "ld.local" not in body and "st.local" not in body


@pytest.mark.nvcc
def test_only_seesaw2_el_stores_its_partials_evict_last_and_prefetches_and_only_its_merge_discards_them():
    """seesaw2_el's partial rows carry an L2 evict_last policy (every other schedule's are plain stores), it alone
    prefetches KV into L2 (tiles 2 and 3, from row tile 0's block), and the merge instantiation that launch_verify_sm90
    runs after it (VerifyParams::discard) is the only one with discard.global.L2."""
    bodies = kernel_bodies(compile_ptx("90a"))
    for schedule in cuda_backend.SCHEDULES:
        body = next(b for name, b in bodies.items() if kernel_name(schedule) in name)
        hinted = re.findall(r"st\.global\.L2::cache_hint\.v2\.b32", body)
        if schedule == "seesaw2_el":
            assert len(hinted) == 32 and "createpolicy.fractional.L2::evict_last.b64" in body  # 2 rows x 16 stores
        else:
            assert not hinted and "createpolicy" not in body, schedule
        prefetches = re.findall(r"cp\.async\.bulk\.prefetch\.tensor\.2d\.L2\.global", body)
        assert len(prefetches) == (18 if schedule == "seesaw2_el" else 0), schedule  # tiles 2 and 3, 9 boxes each
    merges = {name: b for name, b in kernel_bodies(unit_ptx("verify_kernel.cu", "90a")).items() if "combine" in name}
    discarding = [name for name, b in merges.items() if "discard.global.L2" in b]
    assert discarding == [next(n for n in merges if "grouped2_kernelILb1ELb1E" in n)], sorted(merges)


def test_pick_schedule_stores_evict_last_at_two_row_tiles_past_half_the_l2():
    """seesaw2_el where seesaw2 runs with <= EL_MAX_ROWS query rows and a KV capacity past EL_L2_SHARE (half) of the L2
    (32k-65k T=16 on the H200's 60 MB), seesaw2 otherwise: at T=64, at 16k (19 MB), and where the capacity or the L2
    size is not given."""
    pick, l2 = cuda_backend.pick_schedule, 60 * 2**20
    assert cuda_backend.EL_MAX_ROWS == 128 and cuda_backend.EL_L2_SHARE == 0.5
    assert pick(16, 8, 16, 65536, l2) == pick(16, 8, 8, 32768, l2) == "seesaw2_el"
    assert pick(16, 8, 4, 16384, l2) == "seesaw2"  # 19 MB of KV: within the spread there
    assert pick(64, 8, 64, 65536, l2) == "seesaw2"  # 8 row tiles: slower with it
    assert pick(16, 8, 16, 65536, None) == pick(16, 8, 16, None, l2) == pick(16, 8) == "seesaw2"
    row, half = cuda_backend.D_QK_BYTES, l2 // 2  # one KV token's bytes
    assert pick(16, 8, 16, half // row, l2) == "seesaw2" and pick(16, 8, 16, half // row + 1, l2) == "seesaw2_el"
    assert pick(16, 8, 2, 65536, l2) == cuda_backend.DEFAULT_SCHEDULE  # too few tiles a split for seesaw2 at all


@pytest.mark.nvcc
def test_sm90a_build_has_no_spills():
    report = ptxas_report()
    spills = SPILLS.findall(report)
    assert len(spills) >= 2 and all(s == ("0", "0") for s in spills), report


@pytest.mark.nvcc
def test_sm90a_register_caps_hold():
    """A capped schedule (REGISTER_CAPS) carries exactly its cap as .maxnreg (no other kernel has one: they run at their
    launch bounds) and ptxas keeps it at or under the cap; each schedule's kernel is compiled once."""
    bodies = kernel_bodies(compile_ptx("90a"))
    used = dict(re.findall(r"Compiling entry function '(\w+)'.*?Used (\d+) registers", ptxas_report(), re.S))
    for schedule in cuda_backend.SCHEDULES:
        cap = cuda_backend.REGISTER_CAPS.get(schedule)
        body = [b for name, b in bodies.items() if kernel_name(schedule) in name]
        found = [int(n) for name, n in used.items() if kernel_name(schedule) in name]
        assert len(body) == 1 and len(found) == 1, (schedule, sorted(used))
        header = body[0].split("{")[0]
        assert re.findall(r"\.maxnreg (\d+)", header) == ([str(cap)] if cap else []), (schedule, header[-200:])
        assert found[0] <= (cap or 255), (schedule, found)


@pytest.mark.nvcc
def test_sm90a_half_wgmma_is_not_serialized():
    """ptxas reports a wgmma it had to wait for or serialize (C7514 / C7515 / C7517) by kernel name."""
    lines = [ln for ln in ptxas_report().splitlines() if re.search(r"C751[0-9]", ln)]
    assert not [ln for ln in lines if any(k in ln for k in [HALF_KERNEL, *SMALL_KERNELS, *SEESAW2_KERNELS])], lines


@pytest.mark.nvcc
def test_other_arches_get_a_stub():
    ptx = compile_ptx("120")
    assert "wgmma" not in ptx and "cp.async.bulk" not in ptx and "setmaxnreg" not in ptx


def test_sm90_is_built_as_sm90a():
    assert "-gencode=arch=compute_90a,code=sm_90a" in build.gencode_flags(("90", "120"))
    assert "verify_sm90.cu" in build.SOURCES and "verify_sm90.cuh" in build.HEADERS


def test_path_switch(monkeypatch):
    kv = torch.zeros(2, 64, 576, dtype=torch.bfloat16)
    assert cuda_backend.resolve_path(kv, "mma") == "mma"
    assert cuda_backend.resolve_path(kv, "auto") == "mma"  # a CPU tensor: sm90 cannot run, falls back
    with pytest.raises(ValueError, match="sm90"):
        cuda_backend.resolve_path(kv, "sm90")
    with pytest.raises(ValueError, match="path"):
        cuda_backend.resolve_path(kv, "hopper")
    monkeypatch.setenv("KDENGINE_CUDA_PATH", "sm90")
    with pytest.raises(ValueError, match="sm90"):
        cuda_backend.resolve_path(kv)
    monkeypatch.setenv("KDENGINE_CUDA_PATH", "wgmma")
    with pytest.raises(ValueError, match="KDENGINE_CUDA_PATH"):
        cuda_backend.resolve_path(kv)


def test_pick_schedule_uses_half_from_its_row_threshold(monkeypatch):
    monkeypatch.setattr(cuda_backend, "SEESAW2_MIN_ROWS", None)
    monkeypatch.setattr(cuda_backend, "HALF_MIN_ROWS", 128)
    monkeypatch.setattr(cuda_backend, "PAIR_MIN_ROWS", 8)  # half is checked first
    assert cuda_backend.pick_schedule(16, 8) == "half" and cuda_backend.pick_schedule(64, 8) == "half"
    assert cuda_backend.pick_schedule(8, 8) == "pair"
    monkeypatch.setattr(cuda_backend, "PAIR_MIN_ROWS", None)
    assert cuda_backend.pick_schedule(8, 8) == cuda_backend.DEFAULT_SCHEDULE


def test_pick_schedule_is_seesaw2_from_128_rows_else_staggered_small():
    # seesaw2 from 128 query rows (T=16 at H=8), staggered_small below (cuda_backend.SEESAW2_MIN_ROWS)
    assert cuda_backend.DEFAULT_SCHEDULE == "staggered_small" and cuda_backend.SEESAW2_MIN_ROWS == 128
    picked = {(t, h): cuda_backend.pick_schedule(t, h) for t in (1, 8, 15, 16, 64, 256) for h in (1, 8, 16)}
    assert {k for k, s in picked.items() if s == "seesaw2"} == {(t, h) for (t, h) in picked if t * h >= 128}
    assert {s for (t, h), s in picked.items() if t * h < 128} == {"staggered_small"}


def test_seesaw2_needs_its_tiles_per_split_else_staggered_small():
    # 4k T=16 plans NSPLIT 32: 128 tokens = 2 KV tiles per split, where staggered_small is the faster; 16k T=16
    # (NSPLIT 64) and 4k T=64 (16) have 4, where seesaw2 is (cuda_backend.SEESAW2_MIN_TILES)
    split_tiles = cuda_backend.split_tiles
    assert split_tiles(4096, 32) == 2 and split_tiles(16384, 64) == 4 and split_tiles(4096, 16) == 4
    assert split_tiles(4095, 32) == 2 and split_tiles(4097, 32) == 3 and split_tiles(100, 1) == 2  # the kernel's cut
    assert split_tiles(65536, 64) == 16 and split_tiles(1, 1) == 1
    with pytest.raises(ValueError, match="nsplit"):
        split_tiles(4096, 0)
    assert cuda_backend.SEESAW2_MIN_TILES == 4
    pick = cuda_backend.pick_schedule
    assert pick(16, 8, split_tiles(4096, 32)) == "staggered_small" and pick(16, 8, 3) == "staggered_small"
    assert pick(16, 8, split_tiles(16384, 64)) == "seesaw2" and pick(64, 8, split_tiles(4096, 16)) == "seesaw2"
    assert pick(8, 8, 64) == "staggered_small"  # below the rows: the tiles do not matter
    assert pick(16, 8) == "seesaw2"  # tiles unknown: rows alone


def test_pick_schedule_uses_seesaw2_from_its_row_threshold(monkeypatch):
    monkeypatch.setattr(cuda_backend, "SEESAW2_MIN_ROWS", None)  # off: never picked
    assert "seesaw2" not in {cuda_backend.pick_schedule(t, h) for t in (1, 16, 64, 256) for h in (1, 8, 16)}
    monkeypatch.setattr(cuda_backend, "SEESAW2_MIN_ROWS", 256)
    assert cuda_backend.pick_schedule(32, 8) == "seesaw2"  # checked first
    assert cuda_backend.pick_schedule(31, 8) == cuda_backend.DEFAULT_SCHEDULE


def test_pick_schedule_uses_pair_from_the_row_threshold(monkeypatch):
    # pair is opt-in: with seesaw2 off, the default schedule at every T
    monkeypatch.setattr(cuda_backend, "SEESAW2_MIN_ROWS", None)
    assert {cuda_backend.pick_schedule(t, 8) for t in (1, 16, 64, 256)} == {cuda_backend.DEFAULT_SCHEDULE}
    monkeypatch.setattr(cuda_backend, "PAIR_MIN_ROWS", 512)
    rows = cuda_backend.PAIR_MIN_ROWS
    assert cuda_backend.pick_schedule(rows // 8, 8) == "pair"
    assert cuda_backend.pick_schedule(max(1, rows // 8 - 1), 8) == cuda_backend.DEFAULT_SCHEDULE
    assert set(map(cuda_backend.pick_schedule, (1, 16, 64, 256), (8,) * 4)) <= set(cuda_backend.SCHEDULES)


def test_sm90_auto_nsplit_matches_the_measured_best():
    # the counts the H200 run of 3543d28 measured best (or within noise) among 32 / 64 / 128 splits
    from kdengine.ops.schedule import auto_nsplit

    plan = lambda capacity, T: auto_nsplit(capacity=capacity, batch=1, row_tiles=-(-(T * 8) // cuda_backend.SM90_ROWS),
                                           num_sms=132, min_tokens=cuda_backend.SM90_MIN_TOKENS_PER_SPLIT,
                                           tile_tokens=cuda_backend.SM90_TILE_TOKENS)
    assert [plan(c, T) for c in (4096, 16384, 65536) for T in (16, 64)] == [32, 16, 64, 16, 64, 16]


def test_sm90_launch_arguments_are_checked():
    q = torch.zeros(1, 16, 8, 576, dtype=torch.bfloat16)
    args = (q, None, None, None, None, None, None)
    for combine in (3, 5, 6, -2):  # (3 was the older grouped merge, 5 a fused merge: both removed)
        with pytest.raises(ValueError, match="combine"):
            cuda_backend.launch_sm90(*args, sm_scale=0.1, nsplit=12, schedule="staggered", combine=combine)
    with pytest.raises(ValueError, match="schedule"):
        cuda_backend.launch_sm90(*args, sm_scale=0.1, nsplit=12, schedule="fused")
    for bad in (1, "yes", 0.0):  # the binding takes a bool: anything else would convert silently or fail there
        with pytest.raises(ValueError, match="^merge_early: expected None or a bool"):
            cuda_backend.launch_sm90(*args, sm_scale=0.1, nsplit=12, schedule="seesaw2", merge_early=bad)
        with pytest.raises(ValueError, match="^merge_early: expected None or a bool"):
            cuda_backend.launch(*args, sm_scale=0.1, nsplit=12, merge_early=bad)
    # seesaw2 takes the row max of unscaled scores (right for a scale > 0 only): both launchers refuse the rest
    for bad in (0.0, -0.1, float("nan"), float("inf"), True):
        with pytest.raises(ValueError, match="^sm_scale: expected a finite float > 0"):
            cuda_backend.launch_sm90(*args, sm_scale=bad, nsplit=12, schedule="seesaw2")
        with pytest.raises(ValueError, match="^sm_scale: expected a finite float > 0"):
            cuda_backend.launch(*args, sm_scale=bad, nsplit=12)


# --- GPU (sm_90) ------------------------------------------------------------------------------------


def _needs_sm90():
    if torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("the sm90 kernel runs on sm_90 only")


def _run_sm90(inp, nsplit, schedule, combine=None):
    B, T, H, _ = inp.q.shape
    bits = pack_tree_mask(inp.tree_mask)
    splits = cuda_backend.plan_nsplit_sm90(inp.q, inp.kv_cache, inp.page_table, nsplit)
    out = torch.full((B, T, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((B, T, H), float("nan"), dtype=torch.float32, device="cuda")
    cuda_backend.launch_sm90(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, out, lse,
                             sm_scale=inp.sm_scale, nsplit=splits, schedule=schedule, combine=combine)
    return out, lse


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", list(cuda_backend.SCHEDULES))
@pytest.mark.parametrize("tp", CONTRACT + ODD + [TestParam(16, [3000, 129, 64, 4000], B=4, H=16)],
                         ids=lambda tp: f"T{tp.T}-p{tp.prefix}-H{tp.H}-B{tp.B}-s{tp.nsplit}-ps{tp.page_size}")
def test_sm90_matches_reference(tp, schedule):
    _needs_sm90()
    inp = _problem(tp, seed=31)
    out, lse = _run_sm90(inp, tp.nsplit, schedule)
    _check(inp, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["pair", "half", "staggered_small", "staggered_tail", "seesaw2", "seesaw2_bar",
                                      "seesaw2_el"])
@pytest.mark.parametrize("L", [40, 64, 100, 128, 150, 192, 250, 1000])
def test_sm90_pair_every_tile_count_and_tail(L, schedule):
    """pair and seesaw2 split a block's tiles into (even, odd) steps, half peels the last tile's P V: one split
    of 1-16 tiles, the tail in either half of a tile."""
    _needs_sm90()
    for tp in (TestParam(17, L - 17, H=2, nsplit=1), TestParam(17, L - 17, H=4, nsplit=1, page_size=16)):
        inp = _problem(tp, seed=L)
        out, lse = _run_sm90(inp, tp.nsplit, schedule)
        _check(inp, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["staggered", "staggered_small", "seesaw2"])
@pytest.mark.parametrize("T", [33, 64, 65, 100, 256])
def test_sm90_tail_mask_words(T, schedule):
    """staggered_small finds a tail tile's mask from the <= 3 packed words each row's scores reach (csrc
    tail_bits; seesaw2 with its rolled loop beside it): trees across word boundaries, the tree starting at every offset class of a word and a tile,
    tail tiles that hold prefix tokens, splits that end inside the tree (nsplit 3), 16-token pages, a chain."""
    _needs_sm90()
    for prefix in (0, 1, 31, 32, 33, 63, 64, 95, 130, 1000 + T % 7):
        for tp in (TestParam(T, prefix, H=2, nsplit=1), TestParam(T, prefix, H=2, nsplit=3, page_size=16),
                   TestParam(T, prefix, H=1, nsplit=2, chain=prefix % 2 == 1)):
            inp = _problem(tp, seed=T + prefix)
            out, lse = _run_sm90(inp, tp.nsplit, schedule)
            _check(inp, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", list(cuda_backend.SCHEDULES))
def test_sm90_running_max_moves_often(schedule):
    """Keys scaled up page by page along the sequence: the rows' max keeps growing, by more than 2^8 (log2)
    at a time in places, so half's lazy rescale of O and l runs on many tiles, not only the first."""
    _needs_sm90()
    for tp in (TestParam(16, 4000, nsplit=1), TestParam(16, 4000, nsplit=4), TestParam(33, 700, H=2, nsplit=1)):
        inp = _problem(tp, seed=17)
        inp.q.mul_(3.0)
        pages = inp.page_table[0, : -(-(int(inp.prefix_len[0]) + tp.T) // tp.page_size)].long()
        grow = 1.0 + 0.15 * torch.arange(len(pages), device="cuda", dtype=torch.float32)
        inp.kv_cache[pages] = (inp.kv_cache[pages].float() * grow[:, None, None]).to(inp.kv_cache.dtype)
        out, lse = _run_sm90(inp, tp.nsplit, schedule)
        _check(inp, out, lse)


@pytest.mark.gpu
def test_sm90_nan_past_the_end_is_ignored():
    """Pool slots past a sequence's end (same page) may hold anything: NaN there must not leak."""
    _needs_sm90()
    inp = _problem(TestParam(16, 1000 - 16), seed=2)
    L = int(inp.prefix_len[0]) + 16
    page = int(inp.page_table[0, L // 64])
    inp.kv_cache[page, L % 64:] = float("nan")
    for schedule in cuda_backend.SCHEDULES:
        out, lse = _run_sm90(inp, 3, schedule)
        _check(inp, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("capacity", [5000, 40000])
@pytest.mark.parametrize("T, schedule", [(16, "seesaw2"), (9, "staggered_small")])
def test_sm90_through_verify_attention_and_graphs(monkeypatch, capacity, T, schedule):
    """The dispatched call (seesaw2 from 128 query rows and SEESAW2_MIN_TILES KV tiles per split, else
    staggered_small; at capacity 5000 T=16 has 3 tiles per split, so staggered_small runs it, at 40000 seesaw2),
    captured once and replayed at several lengths with poisoned outputs."""
    _needs_sm90()
    from kdengine.ops.verify import verify_attention

    monkeypatch.setenv("KDENGINE_CUDA_PATH", "sm90")
    inp = _problem(TestParam(T, [900, 40], B=2), seed=3)
    out, lse = verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="cuda", return_lse=True)
    _check(inp, out, lse)
    inp = _problem(TestParam(T, [capacity, capacity], B=2), seed=7)
    assert cuda_backend.pick_schedule(T, 8) == schedule  # by rows alone
    _, splits = cuda_backend.plan(inp.q, inp.kv_cache, inp.page_table, None, "sm90")
    tiles = cuda_backend.split_tiles(inp.page_table.shape[1] * inp.kv_cache.shape[1], splits)
    assert (tiles >= cuda_backend.SEESAW2_MIN_TILES) == (capacity == 40000)  # both sides of the tiles rule run
    _replay_dispatched(inp, ([capacity, 3], [1234, 4097], [0, capacity - 64]))


def _replay_dispatched(inp, lengths_list, new_kv: bool = False):
    """The dispatched call (cuda_backend.run) captured once in a CUDA graph, then replayed at each prefix lengths of
    `lengths_list` (new_kv: the KV pool redrawn before each) with poisoned outputs, each checked."""
    bits = pack_tree_mask(inp.tree_mask)
    prefix_len = inp.prefix_len.clone()
    run = lambda: cuda_backend.run(inp.q, inp.kv_cache, inp.page_table, prefix_len, bits,
                                   sm_scale=inp.sm_scale, nsplit=None, return_lse=True)
    run()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = run()
    for i, lengths in enumerate(lengths_list):
        prefix_len.copy_(torch.tensor(lengths, dtype=torch.int32))
        if new_kv:
            inp.kv_cache.normal_(generator=torch.Generator("cuda").manual_seed(40 + i))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        inp.prefix_len = prefix_len
        _check(inp, out, lse)


@pytest.mark.gpu
def test_sm90_dispatch_past_the_l2_runs_seesaw2_el_in_graphs(monkeypatch):
    """T=16 with a KV capacity past the device's L2 (so past half of it): the dispatched call runs seesaw2_el (partials
    stored evict_last, discarded by its merge once read), captured once and replayed with new lengths, new KV and
    poisoned outputs."""
    _needs_sm90()
    monkeypatch.setenv("KDENGINE_CUDA_PATH", "sm90")
    capacity = cuda_backend.l2_bytes("cuda") // cuda_backend.D_QK_BYTES + 4096
    inp = _problem(TestParam(16, [capacity - 16, 3000], B=2), seed=9)
    cap = inp.page_table.shape[1] * inp.kv_cache.shape[1]
    _, splits = cuda_backend.plan(inp.q, inp.kv_cache, inp.page_table, None, "sm90")
    assert cuda_backend.pick_schedule(16, 8, cuda_backend.split_tiles(cap, splits), cap,
                                      cuda_backend.l2_bytes("cuda")) == "seesaw2_el"
    _replay_dispatched(inp, ([capacity - 16, 3000], [5000, capacity - 16], [capacity - 16, capacity - 16]), new_kv=True)
