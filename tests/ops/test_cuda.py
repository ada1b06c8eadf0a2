"""The CUDA verify kernel (csrc/) against the fp32 reference, plus the CPU-side pieces: the
availability reason, the nvcc flag assembly and the `kdengine build` parser.

GPU tests (marked gpu) poison every output first, use fresh random inputs, and require relative L2
error < 1e-2 on out and |lse - ref| < 1e-2 (the split partials are bf16, their lse fp32).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kdengine.ops import build, cuda_backend
from kdengine.ops.inputs import make_verify_inputs, rel_l2
from kdengine.ops.mask import pack_tree_mask
from kdengine.ops.reference import verify_attention_reference

TOL = 1e-2

# --- CPU: availability, flags, CLI ------------------------------------------------------------------


def test_available_gives_a_reason_without_a_gpu():
    reason = cuda_backend.available(torch.device("cpu"))
    assert isinstance(reason, str) and "no CUDA device" in reason


def test_available_never_raises_when_the_build_fails(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(build, "load_extension", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("nvcc not found\nmore")))
    monkeypatch.setattr(cuda_backend, "_REASON", {})
    assert cuda_backend.available(torch.device("cuda", 0)) == "the CUDA extension did not build: nvcc not found"


def test_missing_nvcc_is_reported(monkeypatch):
    monkeypatch.setattr(build.shutil, "which", lambda name: None)
    assert "nvcc not found" in build.missing_toolchain()


def test_resolve_archs():
    assert build.resolve_archs("all") == ("80", "90", "100", "120")
    assert build.resolve_archs("sm_90, 120") == ("90", "120")
    with pytest.raises(ValueError, match="arch"):
        build.resolve_archs("hopper")


def test_gencode_flags_cover_every_arch_plus_ptx():
    flags = build.nvcc_flags(build.resolve_archs("all"))
    for arch in ("80", "90a", "100", "120"):
        assert f"-gencode=arch=compute_{arch},code=sm_{arch}" in flags
    assert "-gencode=arch=compute_120,code=compute_120" in flags
    assert not any("SCALAR" in f for f in flags)
    assert "-DKDENGINE_SCALAR_LOADS" in build.nvcc_flags(("90",), scalar_loads=True)
    assert build.gencode_flags(("90",), ptx=False) == ["-gencode=arch=compute_90a,code=sm_90a"]


def test_the_binding_takes_torchs_cxx_standard():
    # verify_api.cpp includes torch: built with torch's own standard (build.HOST_CFLAGS); the torch-free kernels keep
    # nvcc's -std=c++17
    assert not any(f.startswith("-std") for f in build.HOST_CFLAGS)
    assert "-std=c++17" in build.nvcc_flags(("90",))


def test_extension_names_differ_per_variant():
    names = {build.extension_name(a, s) for a in (("90",), build.ALL_ARCHS) for s in (False, True)}
    assert len(names) == 4


def test_launch_rejects_a_bad_warp_layout():
    with pytest.raises(ValueError, match="col_warps"):
        cuda_backend.launch(*[None] * 7, sm_scale=1.0, nsplit=1, col_warps=3)
    with pytest.raises(ValueError, match="row_groups"):
        cuda_backend.launch(*[None] * 7, sm_scale=1.0, nsplit=1, row_groups=3)
    with pytest.raises(ValueError, match="combine"):
        cuda_backend.launch(*[None] * 7, sm_scale=1.0, nsplit=1, combine=5)


def test_the_retired_merge_3_is_refused():
    # combine 3 (the older grouped merge, slower than 4: perf_history/kernel/merge2_b44f69a/) was removed; the other
    # merges keep their numbers. Both launchers refuse 3 before any CUDA call, naming the argument and the retirement
    # (the binding's own check: ci/gpu/binding_errors.py mma_retired_combine_3 / sm90_retired_combine_3).
    assert cuda_backend.COMBINES == (0, 1, 2, 4, 7)
    assert (cuda_backend.DEFAULT_COMBINE, cuda_backend.SM90_COMBINE) == (7, 7)  # the mma.sync path's, the sm90 path's
    with pytest.raises(ValueError, match=r"^combine: expected one of \(0, 1, 2, 4, 7\), got 3 \(3, .* was retired"):
        cuda_backend.launch(*[None] * 7, sm_scale=1.0, nsplit=1, combine=3)
    q = torch.zeros(1, 16, 8, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"^combine: expected one of \(-1, 0, 1, 2, 4, 7\), got 3 \(3, .* was retired"):
        cuda_backend.launch_sm90(q, *[None] * 6, sm_scale=0.1, nsplit=12, schedule="seesaw2", combine=3)


def test_each_launcher_hands_its_paths_merge_to_the_binding(monkeypatch):
    # combine None: the mma.sync launcher passes DEFAULT_COMBINE, the sm90 one SM90_COMBINE (7 both), read at the call
    # (a caller that sets either module value is obeyed); a named merge passes through
    seen = []

    class Module:
        def launch(self, *args):
            seen.append(("mma", args[-2]))

        def launch_sm90(self, *args):
            seen.append(("sm90", args[-2]))

    monkeypatch.setattr(build, "load_extension", lambda *a, **k: Module())
    q = torch.zeros(1, 16, 8, 576, dtype=torch.bfloat16)
    args = (q, torch.zeros(4, 64, 576, dtype=torch.bfloat16), torch.zeros(1, 4, dtype=torch.int32), None, None, None,
            None)
    cuda_backend.launch(*args, sm_scale=0.1, nsplit=2)
    cuda_backend.launch(*args, sm_scale=0.1, nsplit=2, combine=4)
    cuda_backend.launch_sm90(*args, sm_scale=0.1, nsplit=2, schedule="seesaw2")
    cuda_backend.launch_sm90(*args, sm_scale=0.1, nsplit=2, schedule="seesaw2", combine=4)
    monkeypatch.setattr(cuda_backend, "DEFAULT_COMBINE", 2)
    monkeypatch.setattr(cuda_backend, "SM90_COMBINE", 0)
    cuda_backend.launch(*args, sm_scale=0.1, nsplit=2)
    cuda_backend.launch_sm90(*args, sm_scale=0.1, nsplit=2, schedule="seesaw2")
    assert seen == [("mma", 7), ("mma", 4), ("sm90", 7), ("sm90", 4), ("mma", 2), ("sm90", 0)]


def test_auto_nsplit_fills_one_wave_without_empty_splits():
    from kdengine.ops.schedule import auto_nsplit

    plan = lambda capacity, tiles: auto_nsplit(capacity=capacity, batch=1, row_tiles=tiles, num_sms=132,
                                               min_tokens=cuda_backend.MIN_TOKENS_PER_SPLIT, tile_tokens=32)
    for capacity in (4096, 16384, 65536, 5000):
        for tiles in (1, 2, 8, 64):
            n = plan(capacity, tiles)
            assert n * tiles <= 132 or n == 1  # never a partial second wave
            chunk = math.ceil(math.ceil(capacity / n) / 32) * 32
            assert (n - 1) * chunk < capacity  # the last split holds tokens at full capacity
    assert plan(65536, 2) == 64 and plan(65536, 8) == 16 and plan(4096, 2) == 4096 // cuda_backend.MIN_TOKENS_PER_SPLIT


def test_row_tiles_follow_block_rows():
    tiles = lambda r, rg, cw=2: cuda_backend.row_tiles(r, rg, cw)
    assert [tiles(r, 4) for r in (1, 16, 17, 32, 33, 64, 65, 128, 4080)] == [1, 1, 1, 1, 1, 1, 2, 2, 64]
    assert [tiles(r, 2) for r in (16, 32, 33, 128)] == [1, 1, 2, 4]
    assert [tiles(r, 1) for r in (16, 17, 128)] == [1, 2, 8]
    # the wide layout holds at least 32 rows per block
    assert [tiles(r, 1, cuda_backend.WIDE) for r in (16, 17, 33, 128)] == [1, 1, 2, 4]
    assert [tiles(r, 4, cuda_backend.WIDE) for r in (16, 33, 65, 512)] == [1, 1, 2, 8]
    assert [tiles(r, 1, cuda_backend.WIDE2) for r in (16, 17, 33, 128)] == [1, 1, 2, 4]
    assert [tiles(r, 1, cuda_backend.WIDE2X16) for r in (16, 65, 128, 512)] == [1, 2, 2, 8]  # always 64 rows


def test_build_subcommand_is_registered():
    from kdengine.cli import build_parser

    args = build_parser().parse_args(["build", "--arch", "native", "--scalar-loads"])
    assert args.arch == "native" and args.scalar_loads and callable(args.func)


# --- GPU: correctness against the reference ----------------------------------------------------------


@dataclass
class TestParam:
    __test__ = False
    T: int  # tree tokens
    prefix: int | list[int]  # committed tokens (one per sequence when a list)
    H: int = 8  # heads on this rank
    B: int = 1  # sequences
    nsplit: int | str | None = None  # None: the backend default
    page_size: int = 64
    chain: bool = False  # a chain (causal) mask instead of a random tree


CONTRACT = [TestParam(T, ctx - T) for ctx in (4096, 16384, 65536) for T in (16, 64)]
ODD = [
    TestParam(1, 0),
    TestParam(1, 1000, H=16),
    TestParam(17, 1, H=1),
    TestParam(255, 63, H=1),
    TestParam(16, 65, H=16),
    TestParam(33, 100, page_size=16, chain=True),
    TestParam(16, [5000, 1, 777], B=3),
    TestParam(64, [0, 300, 4000], B=3, H=16),
    TestParam(16, 100, nsplit=256),  # most splits empty
    TestParam(17, 3000, nsplit=1),
    TestParam(16, 3000, nsplit=7, page_size=256),
    TestParam(16, 3000, nsplit="auto"),
]


def _problem(tp: TestParam, seed: int = 0):
    return make_verify_inputs(
        B=tp.B, T=tp.T, H=tp.H, prefix=tp.prefix, page_size=tp.page_size, chain=tp.chain, seed=seed, device="cuda"
    )


def _run_poisoned(inp, nsplit, *, scalar_loads: bool = False, col_warps: int = cuda_backend.DEFAULT_COL_WARPS,
                  row_groups: int = cuda_backend.DEFAULT_ROW_GROUPS, combine: int = cuda_backend.DEFAULT_COMBINE,
                  pingpong: bool = cuda_backend.DEFAULT_PINGPONG):
    B, T, H, _ = inp.q.shape
    bits = pack_tree_mask(inp.tree_mask)
    splits = cuda_backend.plan_nsplit(inp.q, inp.kv_cache, inp.page_table, nsplit, row_groups, col_warps, pingpong)
    out = torch.full((B, T, H, 512), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = torch.full((B, T, H), float("nan"), dtype=torch.float32, device="cuda")
    cuda_backend.launch(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, out, lse,
                        sm_scale=inp.sm_scale, nsplit=splits, scalar_loads=scalar_loads, col_warps=col_warps,
                        row_groups=row_groups, combine=combine, pingpong=pingpong)
    return out, lse


def _check(inp, out, lse):
    ref_out, ref_lse = verify_attention_reference(
        inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, pack_tree_mask(inp.tree_mask),
        sm_scale=inp.sm_scale, return_lse=True,
    )
    assert torch.isfinite(out.float()).all() and torch.isfinite(lse).all(), "poisoned output left unwritten"
    err = rel_l2(out, ref_out)
    assert err < TOL, f"rel L2 {err:.3g}"
    assert (lse - ref_lse).abs().max().item() < TOL


@pytest.mark.gpu
@pytest.mark.parametrize("tp", CONTRACT + ODD, ids=lambda tp: f"T{tp.T}-p{tp.prefix}-H{tp.H}-B{tp.B}-s{tp.nsplit}")
def test_cuda_matches_reference(tp):
    inp = _problem(tp)
    out, lse = _run_poisoned(inp, tp.nsplit)
    _check(inp, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("nsplit", [16, 32, 64, 128, 256])
def test_nsplit_variants_agree(nsplit):
    inp = _problem(TestParam(16, 2000), seed=nsplit)
    out, lse = _run_poisoned(inp, nsplit)
    _check(inp, out, lse)


# test ids of the split-P*V pingpongs (2; 3 its lean form; 4-11 the lean probes of branch mma4, 12-15 of mma6)
PP_SUFFIX = {2: "2", 3: "2lean", 4: "2leanall", 5: "2leankx2", 6: "2leanfast", 7: "2leanlate", 8: "2leanv5",
             9: "2leanshort", 10: "2leanv4", 11: "2leanv4k", 12: "2leanqs", 13: "2leanqs2",
             14: "2leanup", 15: "2leanqsup"}
LEAN_PROBES = tuple(range(4, 16))
LAYOUT_ID = lambda cw, pp: f"cw{cw}" + ("pp" if pp else "") + PP_SUFFIX.get(int(pp), "")  # (col_warps, pingpong)
# The wide2 layout (col_warps 16: streaming loader, lazy rescaling) over the contract sizes and the odd
# shapes, with both parallel merges; B up to 4, H 8 and 16.
WIDE2_CASES = CONTRACT + ODD + [TestParam(16, [65000, 17, 4000, 129], B=4), TestParam(7, [33, 3000, 1, 640], B=4, H=16)]


# (col_warps, combine, pingpong) of the wide2 reference test.
WIDE2_LAYOUTS = [(cuda_backend.WIDE2, 1, False), (cuda_backend.WIDE2, 2, False), (cuda_backend.WIDE2, 2, True),
                 (cuda_backend.WIDE2, 4, True), (cuda_backend.WIDE2X16, 2, False), (cuda_backend.WIDE2X16, 4, True),
                 (cuda_backend.WIDE2, 4, 2), (cuda_backend.WIDE2, 4, 3),
                 *[(cuda_backend.WIDE2, 4, pp) for pp in LEAN_PROBES]]


def test_wide2_layouts_are_launchable():
    """The GPU test's layouts hold only values the launcher accepts (checked here without a GPU: a retired merge left
    in them stopped a device run's GPU tests at their tenth failure, 5f91fd5)."""
    for col_warps, combine, pingpong in WIDE2_LAYOUTS:
        assert col_warps in cuda_backend.COL_WARPS and combine in cuda_backend.COMBINES
        cuda_backend.check_combine(combine)
        assert int(pingpong) in cuda_backend.PINGPONGS
        assert int(pingpong) not in cuda_backend.SPLIT_PV_PINGPONGS or col_warps == cuda_backend.WIDE2


@pytest.mark.gpu
@pytest.mark.parametrize("layout", WIDE2_LAYOUTS,
                         ids=lambda lay: f"cw{lay[0]}-comb{lay[1]}" + ("-pp" if lay[2] else "") + PP_SUFFIX.get(lay[2], ""))
@pytest.mark.parametrize("tp", WIDE2_CASES, ids=lambda tp: f"T{tp.T}-p{tp.prefix}-H{tp.H}-B{tp.B}-s{tp.nsplit}")
def test_wide2_matches_reference(tp, layout):
    col_warps, combine, pingpong = layout
    inp = _problem(tp, seed=combine)
    out, lse = _run_poisoned(inp, tp.nsplit, col_warps=col_warps, combine=combine, pingpong=pingpong)
    _check(inp, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", [(cuda_backend.WIDE2, False), (cuda_backend.WIDE2, True), (cuda_backend.WIDE2, 2),
                                    (cuda_backend.WIDE2, 3), (cuda_backend.WIDE2X16, False),
                                    (cuda_backend.WIDE2X16, True), *[(cuda_backend.WIDE2, pp) for pp in LEAN_PROBES]],
                         ids=lambda lay: LAYOUT_ID(*lay))
@pytest.mark.parametrize("sm_scale", (1.0, 4.0))
def test_wide2_lazy_rescale_moves_the_max(sm_scale, layout):
    col_warps, pingpong = layout
    # Scores of tens to hundreds (log2 units) that grow along the sequence: the running max passes the
    # lazy threshold tile after tile, so the deferred rescale runs and must still match.
    inp = _problem(TestParam(16, 3000, B=2), seed=9)
    ramp = torch.linspace(0.2, 1.5, inp.kv_cache.shape[0], device="cuda")[:, None, None]
    inp.kv_cache = (inp.kv_cache.float() * ramp).to(torch.bfloat16)
    inp.sm_scale = sm_scale
    out, lse = _run_poisoned(inp, None, col_warps=col_warps, combine=2, pingpong=pingpong)
    _check(inp, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", [(cw, rg, pp) for cw in cuda_backend.COL_WARPS for rg in cuda_backend.ROW_GROUPS
                                    for pp in ((0, 1, 2, 3, *LEAN_PROBES) if cw == cuda_backend.WIDE2 else
                                               (0, 1) if cw in cuda_backend.WIDE_LAYOUTS else (0,))],
                         ids=lambda lay: f"cw{lay[0]}rg{lay[1]}" + ("pp" if lay[2] else "") + PP_SUFFIX.get(lay[2], ""))
@pytest.mark.parametrize("tp", [TestParam(1, 70, H=1), TestParam(17, 63, H=2), TestParam(64, [4000, 65], B=2),
                                TestParam(16, 100, nsplit=256), TestParam(16, 65520 - 16)], ids=str)
def test_every_warp_layout(tp, layout):
    col_warps, row_groups, pingpong = layout
    inp = _problem(tp, seed=col_warps + row_groups + int(pingpong))
    out, lse = _run_poisoned(inp, tp.nsplit, col_warps=col_warps, row_groups=row_groups, pingpong=pingpong)
    _check(inp, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", [(cuda_backend.WIDE2, True), (cuda_backend.WIDE2, 2), (cuda_backend.WIDE2, 3),
                                    (cuda_backend.WIDE2X16, True), (cuda_backend.WIDE2X16, False),
                                    *[(cuda_backend.WIDE2, pp) for pp in LEAN_PROBES]],
                         ids=lambda lay: LAYOUT_ID(*lay))
def test_nan_past_the_end_is_ignored(layout):
    """Pool slots past a sequence's end (same page) may hold anything: NaN there must not leak (the
    zero-filled tail of the last tile is what the kernel reads)."""
    col_warps, pingpong = layout
    inp = _problem(TestParam(16, [1000 - 16, 517], B=2), seed=12)
    for b in range(2):
        L = int(inp.prefix_len[b]) + 16
        inp.kv_cache[int(inp.page_table[b, L // 64]), L % 64:] = float("nan")
    for nsplit in (1, 3, 64):
        out, lse = _run_poisoned(inp, nsplit, col_warps=col_warps, pingpong=pingpong)
        _check(inp, out, lse)


@pytest.mark.gpu
@pytest.mark.parametrize("combine", cuda_backend.COMBINES)
@pytest.mark.parametrize("tp", [TestParam(16, 65520 - 16, nsplit=64), TestParam(64, [4000, 65], B=2, nsplit=33),
                                TestParam(16, 100, nsplit=256), TestParam(17, 3000, nsplit=1),
                                TestParam(3, 40, H=2, nsplit=1100), TestParam(16, 5000, nsplit=45)], ids=str)
def test_both_merges(tp, combine):
    inp = _problem(tp, seed=21)
    out, lse = _run_poisoned(inp, tp.nsplit, combine=combine)
    _check(inp, out, lse)


@pytest.mark.gpu
def test_fp32_partials_are_rejected():
    inp = _problem(TestParam(16, 100), seed=4)
    out, lse = cuda_backend.alloc_outputs(inp.q)
    part_out, part_lse = cuda_backend.alloc_partials(inp.q, 2)
    args = (inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, pack_tree_mask(inp.tree_mask), out, lse)
    with pytest.raises(RuntimeError, match="part_out must be bf16"):
        build.load_extension().launch(*args, part_out.float(), part_lse, inp.sm_scale, 2, cuda_backend.DEFAULT_COL_WARPS,
                                      cuda_backend.DEFAULT_ROW_GROUPS, True, cuda_backend.DEFAULT_COMBINE, False)


@pytest.mark.gpu
def test_binding_checks_that_format_a_number_raise():
    """A failing TORCH_CHECK whose arguments included a number crashed the process (SIGSEGV) on the H200 image (torch
    2.11; verify_api.cpp num()): each check of both entry points whose message holds a number, one process each
    (ci/gpu/binding_errors.py: the bad call must raise RuntimeError naming the argument, then a good call must run)."""
    import os
    import subprocess
    import sys

    import kdengine

    script = Path(__file__).resolve().parents[2] / "ci" / "gpu" / "binding_errors.py"
    # the child imports the kdengine this process imports, wherever the tests were started from
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(kdengine.__file__).resolve().parents[1]),
                                                                     os.environ.get("PYTHONPATH")]))}
    cases = ["mma_bad_col_warps", "mma_bad_pingpong", "mma_nsplit_2_20", "mma_retired_combine_3"] + (
        ["sm90_bad_combine", "sm90_retired_combine_3"] if torch.cuda.get_device_capability() == (9, 0) else [])
    for case in cases:
        r = subprocess.run([sys.executable, "-X", "faulthandler", str(script), case], capture_output=True, text=True,
                           timeout=600, env=env)
        assert r.returncode == 0, f"{case}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}"
        assert "raised:" in r.stdout and "then a good call" in r.stdout


@pytest.mark.gpu
def test_through_verify_attention_and_env_override(monkeypatch):
    from kdengine.ops.verify import verify_attention

    monkeypatch.setenv("KDENGINE_NSPLIT", "5")
    inp = _problem(TestParam(16, [900, 40], B=2), seed=3)
    out, lse = verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="cuda", return_lse=True)
    _check(inp, out, lse)


@pytest.mark.gpu
def test_cuda_graph_replays_at_three_prefix_lengths():
    T, H, capacity = 16, 8, 5000
    inp = make_verify_inputs(B=2, T=T, H=H, prefix=capacity, seed=7, device="cuda")
    bits = pack_tree_mask(inp.tree_mask)
    prefix_len = inp.prefix_len.clone()
    run = lambda: cuda_backend.run(inp.q, inp.kv_cache, inp.page_table, prefix_len, bits,
                                   sm_scale=inp.sm_scale, nsplit=None, return_lse=True)
    run()  # build + warm up outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = run()
    for lengths in ([capacity, 3], [1234, 4097], [0, capacity - 64]):
        prefix_len.copy_(torch.tensor(lengths, dtype=torch.int32))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        inp.prefix_len = prefix_len
        _check(inp, out, lse)


@pytest.mark.gpu
def test_scalar_load_build_matches_reference():
    inp = _problem(TestParam(16, 3000), seed=11)
    out, lse = _run_poisoned(inp, 64, scalar_loads=True)
    _check(inp, out, lse)


@pytest.mark.gpu
def test_custom_op_fake_shapes():
    inp = _problem(TestParam(17, 100, H=2), seed=5)
    real_bits = pack_tree_mask(inp.tree_mask)
    with torch._subclasses.fake_tensor.FakeTensorMode() as mode:
        args = [mode.from_tensor(t) for t in (inp.q, inp.kv_cache, inp.page_table, inp.prefix_len)]
        bits = mode.from_tensor(real_bits)
        out, lse = torch.ops.kdengine.verify_cuda(*args, bits, 0.1, 4)
    assert out.shape == (1, 17, 2, 512) and lse.shape == (1, 17, 2) and lse.dtype == torch.float32


@pytest.mark.parametrize("pingpong", cuda_backend.SPLIT_PV_PINGPONGS)
def test_split_pv_schedule_is_wide2_only(pingpong):
    q = torch.zeros(1, 1, 1, 576, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="pingpong"):
        cuda_backend.launch(q, None, None, None, None, None, None, sm_scale=1.0, nsplit=1,
                            col_warps=cuda_backend.WIDE2X16, pingpong=pingpong)
