"""The kernel sweep (kdengine.bench.kernel) on the CPU: the committed perf_history/kernel/*.json
(schema 1) still render, a schema 2 document renders ours / FlashMLA per size, the old module name
still runs the CLI; on a GPU one case is measured by the one core."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from kdengine.bench import kernel

ROOT = Path(__file__).resolve().parents[2]


def test_committed_records_still_render():
    paths = sorted((ROOT / "perf_history" / "kernel").glob("*.json"))
    assert paths
    for path in paths:
        doc = json.loads(path.read_text())
        text = kernel.render_doc(doc)
        assert "ceilings measured" in text and "cuda" in text  # (sm90-only sets: cuda_sm90_... rows)
        if doc.get("schema", 1) == 1:
            assert "schema 1" in text  # the ceiling of those runs was a copy timed as a graph replay
        else:
            assert "read + write (v2" in text and ("ours / peer" in text) == any(
                "flashmla" in case["results"] for case in doc["cases"])


def test_render_says_dirty_only_where_gits_reading_is_the_commit_measured():
    """A tree git reads as dirty is named so; a run that named its commit (--commit: git_head kept) is not, since the
    device copy's stale .git read its tree against another commit."""
    doc = _doc()
    doc["fingerprint"].update(commit="c" * 40, dirty=True)
    assert f"commit {'c' * 10} (dirty)," in kernel.render_doc(doc)
    doc["fingerprint"].update(git_head="d" * 40, git_dirty=True, dirty=True)  # the records made before named_commit
    assert f"commit {'c' * 10}," in kernel.render_doc(doc)
    doc["fingerprint"].update(dirty=False)
    doc["fingerprint"].pop("git_head")
    assert f"commit {'c' * 10}," in kernel.render_doc(doc)


def _doc():
    def row(us, nsplit=None):
        return {"median_s": us * 1e-6, "samples": [us * 1e-6] * 3, "nsplit": nsplit, "rel_l2": 1e-3,
                "floor_pct": 10.0}

    cases = [{"N": n, "T": t, "H": 8, "floor_s": 1e-5,
              "results": {"cuda/cw8rg4/comb1/sauto": row(cuda, 64), "triton": row(tri), "torch": row(300.0),
                          "flashmla": row(peer), "cuda/cw2rg4/s16": {"error": "RuntimeError: planted"}}}
             for n, t, cuda, tri, peer in ((4096, 16, 27.0, 41.0, 24.0), (65536, 64, 443.0, 415.0, 123.7))]
    return {"schema": 2, "kind": "verify_kernel_cudagraph", "set": "peers", "default_label": "cuda/cw8rg4/comb1/sauto",
            "date": "2026-11-30T12:00:00+00:00", "method": "planted", "fingerprint": {"gpu": "NVIDIA H200"},
            "ceilings": {"copy_bytes_per_s": 4.2e12, "matmul_flops_per_s": 7.5e14, "machine": "m",
                         "dtype": "bfloat16", "method": "v2: planted"}, "cases": cases}


def test_schema_2_renders_ours_over_flashmla():
    text = kernel.render_doc(_doc())
    assert "copy 4.20 TB/s read + write (v2: planted)" in text and "/flashmla" in text
    assert "ours / peer" in text and "unavailable: RuntimeError: planted" in text
    ratio = [x for x in text.splitlines() if x.lstrip().startswith("65536") and "flashmla" in x][-1]
    assert "3.58x" in ratio and "3.35x" in ratio  # cuda 443 / 123.7 and triton 415 / 123.7


def test_peers_set_is_the_dispatched_call_the_default_row_and_the_peers():
    labels = [v[0] for v in kernel.variants(4096, 16, "peers")]
    assert labels == [kernel.DISPATCH, kernel.default_label(), "triton", "torch", "flashmla"]
    full = [v[0] for v in kernel.variants(65536, 16, "full")]
    assert len(full) == len(set(full)) and set(labels) - {kernel.DISPATCH} <= set(full) and "triton_extend" in full


def test_ratio_uses_the_dispatched_row_when_the_record_names_it():
    # on Hopper verify/cuda runs the sm90 kernel: the record's ours / FlashMLA must be that row, not mma.sync's
    doc = _doc()
    doc["ours_label"] = kernel.DISPATCH
    for case, us in zip(doc["cases"], (16.8, 193.0), strict=True):
        case["results"][kernel.DISPATCH] = dict(case["results"]["flashmla"], median_s=us * 1e-6)
    ratio = [x for x in kernel.render_doc(doc).splitlines() if x.lstrip().startswith("65536") and "flashmla" in x]
    assert "1.56x" in ratio[-1] and "3.58x" not in ratio[-1]  # 193.0 / 123.7


@pytest.mark.gpu
def test_one_case_on_the_gpu():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    from kdengine.bench import roofline

    case = kernel.measure_case(4096, 16, roofline.ceilings("cuda"), "peers", samples=20)
    row = case["results"][kernel.default_label()]
    assert row["rel_l2"] < 1e-2 and row["median_s"] > 0 and row["method"] == "cuda-graph"
    ours = case["results"][kernel.DISPATCH]
    assert ours["rel_l2"] < 1e-2 and ours["median_s"] > 0


@pytest.mark.parametrize("order", kernel.ORDERS)
def test_measure_case_times_every_buildable_variant_in_either_order(monkeypatch, order):
    """On the CPU (input sets on the CPU, the torch composition twice and a backend that cannot run):
    the failing row is an error in its place, the others are timed, checked and tagged with the order."""
    from kdengine.bench import roofline, verify_timing

    cpu_sets = verify_timing.input_sets
    monkeypatch.setattr(verify_timing, "input_sets", lambda **kw: cpu_sets(**{**kw, "device": "cpu"}))
    monkeypatch.setattr(kernel, "H", 2)
    monkeypatch.setattr(kernel, "variants", lambda N, T, which: [
        ("torch", "torch", None, False, None), ("broken", "no_such_backend", None, False, None),
        ("torch/aa", "torch", None, False, None)])
    case = kernel.measure_case(200, 5, roofline.ceilings("cpu"), "peers", samples=2, order=order)
    assert list(case["results"]) == ["torch", "broken", "torch/aa"] and case["order"] == order
    assert "error" in case["results"]["broken"]
    for label in ("torch", "torch/aa"):
        row = case["results"][label]
        assert row["rel_l2"] < 1e-2 and len(row["samples"]) == 2 and row["order"] == order
    with pytest.raises(ValueError, match="order"):
        kernel.measure_case(200, 5, roofline.ceilings("cpu"), "peers", order="shuffled")


def test_a_throttled_or_capped_row_is_marked_in_the_table():
    doc = json.loads((ROOT / "perf_history/kernel/order_2b9fdff/verify_kernel_order2_2b9fdff.json").read_text())
    table = kernel.render_doc(doc)
    row = next(line for line in table.splitlines() if line.split()[:3] == ["65536", "64", "flashmla"])
    assert row.endswith("(throttled, capped 100%)")  # interleaved, no spin gaps: the power cap all along
    clean = json.loads((ROOT / "perf_history/kernel/order_e8ba5e7/verify_kernel_order2_e8ba5e7.json").read_text())
    assert "capped" not in kernel.render_doc(clean) and "throttled" not in kernel.render_doc(clean)


def test_nsplit_set_checks_the_dispatched_planner_against_fixed_splits():
    rows = kernel.variants(16384, 16, "nsplit")
    assert rows[-1][:3] == (kernel.DISPATCH, "cuda_auto", "auto")
    fixed = [r[2] for r in rows[:-1]]
    assert fixed and all(isinstance(s, int) for s in fixed) and len({r[0] for r in rows}) == len(rows)


def test_mma2_set_has_an_aa_control_and_the_named_layouts():
    rows = {v[0]: v for v in kernel.variants(65536, 64, "mma2")}
    default = kernel.default_label()
    assert default in rows and f"{default}/aa" in rows  # the same call twice: the run's own noise
    assert rows[default][1:] == rows[f"{default}/aa"][1:]
    assert [v[2] for v in rows.values() if v[4] == kernel.default_layout()] == [16, 32, 64, 128]
    others = [kernel.MMA_LAYOUTS[n] for n in kernel.MMA2_LAYOUTS if kernel.MMA_LAYOUTS[n] != kernel.default_layout()]
    assert others and all(f"cuda/{kernel.layout_label(*lay)}/sauto" in rows for lay in others)
    assert len(rows) == len(kernel.variants(65536, 64, "mma2"))  # no label twice
    assert kernel.layout_label(16, 4, 3, 2) == "cw16rg4/comb3/pp2" and kernel.layout_label(16, 4, 3, True).endswith("/pp")
    assert "flashmla" in rows


def test_merge_set_times_and_labels_the_dispatched_schedule():
    for N, T in ((4096, 16), (65536, 64)):
        rows = kernel.variants(N, T, "merge")
        assert [r[0] for r in rows] == ["cuda_sm90_dispatched/c0/sauto", "cuda_sm90_dispatched/c0/splitonly/sauto"]
        assert {r[1] for r in rows} == {"cuda_sm90_dispatched"}
    assert kernel.SM90_BACKENDS["cuda_sm90_dispatched"] is None  # launch_sm90's schedule None: its own pick


def test_pdl_set_times_both_merge_launch_points_the_split_alone_and_the_default_twice(monkeypatch):
    from kdengine.ops import cuda_backend

    for hopper in (True, False):
        monkeypatch.setattr(kernel, "hopper", lambda h=hopper: h)
        rows = kernel.variants(65536, 16, "pdl")
        labels = [label for label, *_ in rows]
        assert len(set(labels)) == len(labels) == (7 if hopper else 3)
        sm90, mma = rows[:-3], rows[-3:]
        if hopper:  # the sm90 default, its other launch point, the split kernel alone, the default again
            default = cuda_backend.DEFAULT_MERGE_EARLY
            assert [layout for *_, layout in sm90] == [{}, {"merge_early": not default},
                                                        {"combine": cuda_backend.SPLIT_ONLY}, {}]
            assert {backend for _, backend, *_ in sm90} == {"cuda_sm90_dispatched"}
            assert sm90[0][0] == f"cuda_sm90_dispatched/early{int(default)}/sauto" and "/aa/" in sm90[3][0]
        early, layout = cuda_backend.DEFAULT_MMA_MERGE_EARLY, kernel.default_layout()
        assert [(backend, lay) for _, backend, _, _, lay in mma] == [("cuda", layout), ("cuda", (*layout, not early)),
                                                                     ("cuda", layout)]
        assert mma[0][0].endswith(f"/early{int(early)}/sauto") and "/aa/" in mma[2][0]


def test_spread_set_times_the_merges_4_and_7_in_abba_order_beside_the_peer(monkeypatch):
    from kdengine.bench import peers

    for hopper in (True, False):
        monkeypatch.setattr(kernel, "hopper", lambda h=hopper: h)
        rows = kernel.variants(65536, 16, "spread")
        labels = [label for label, *_ in rows]
        assert len(set(labels)) == len(labels) == (4 if hopper else 0) + 4 + len(peers.PEERS)
        if hopper:  # the dispatched sm90 call, merge 4, 7, 7, 4 (the second pair the A/A rows)
            assert [(r[1], r[4]) for r in rows[:4]] == [("cuda_sm90_dispatched", {"combine": c}) for c in (4, 7, 7, 4)]
            assert "/aa/" in labels[2] and "/aa/" in labels[3]
        mma = rows[-4 - len(peers.PEERS):len(rows) - len(peers.PEERS)]
        cw, rg, comb, pp = kernel.default_layout()
        assert [r[4] for r in mma] == [(cw, rg, c, pp) for c in (4, 7, 7, 4)] and comb == 7
        assert "/aa/" in mma[2][0] and "/aa/" in mma[3][0]
        assert all(r[2] == "auto" for r in rows[:-len(peers.PEERS)])
    assert "spread" in kernel.SETS


def test_mma4_and_mma6_sets_time_the_probes_beside_the_default_twice():
    # 64-row blocks; 32-row (T * H <= 32): mma4 times its small layouts there, mma6 only the default twice
    for which, T, names in (("mma4", 64, kernel.MMA4_LAYOUTS), ("mma4", 4, kernel.MMA4_SMALL_LAYOUTS),
                            ("mma6", 64, kernel.MMA6_LAYOUTS), ("mma6", 4, ())):
        rows = kernel.variants(65536, T, which)
        labels = [v[0] for v in rows]
        default = kernel.default_label()
        assert labels[:2] == [default, f"{default}/aa"] and rows[0][1:] == rows[1][1:]
        assert labels[2:] == [f"cuda/{kernel.layout_label(*kernel.MMA_LAYOUTS[n])}/sauto" for n in names
                              if kernel.MMA_LAYOUTS[n] != kernel.default_layout()]
        assert len(set(labels)) == len(labels) and all(v[2] == "auto" for v in rows)
    # every named layout runs the default merge, so the layouts differ in the split kernel only
    from kdengine.ops import cuda_backend

    assert all(lay[2] == cuda_backend.DEFAULT_COMBINE for lay in kernel.MMA_LAYOUTS.values())
    # the default (branch mma6's pingpong 12) is one of the mma6 probes, the previous one (8) timed beside it
    assert kernel.MMA_LAYOUTS["mma_lean_qs"] == kernel.default_layout() and "mma_lean_v5" in kernel.MMA6_LAYOUTS
    assert kernel.build_parser().parse_args(["measure", "--out", "x", "--set", "mma4", "--trees", "1,2"]).trees == "1,2"


def test_once_path_names_the_mma_layouts():
    args = kernel.build_parser().parse_args(["once", "--path", "mma_wide2pp2", "--T", "5"])
    assert args.path in kernel.MMA_LAYOUTS and args.T == 5


@pytest.mark.parametrize("extra", [["--pingpong", "12"], ["--col-warps", "16"]])
def test_once_refuses_a_layout_option_beside_path(extra, capsys):
    args = kernel.build_parser().parse_args(["once", "--path", "sm90_seesaw2", *extra])
    assert args.func(args) == 2  # before any CUDA call: this machine has none
    assert extra[0] in capsys.readouterr().err


@pytest.mark.parametrize("path, combine", [("mma", None), ("mma", 7), ("mma_wide2pp2", 0), ("sm90_seesaw2", 7)])
def test_once_applies_combine_to_the_path_it_forces(path, combine, monkeypatch, capsys):
    # `once --path mma --combine C` times merge C after the mma.sync default (it used to drop --combine silently)
    from kdengine.ops import inputs, verify

    make = inputs.make_verify_inputs
    monkeypatch.setattr(inputs, "make_verify_inputs", lambda **kw: make(**{**kw, "device": "cpu"}))
    seen = {}

    def fake_launcher(name, inp, bits, nsplit, *, layout=None):
        seen.update(name=name, layout=layout)
        out = verify.verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="reference")
        return (lambda: None), nsplit, (lambda: out)

    monkeypatch.setattr(kernel, "launcher", fake_launcher)
    argv = ["once", "--path", path, "--T", "3", "--prefix", "40"] + ([] if combine is None else ["--combine", str(combine)])
    args = kernel.build_parser().parse_args(argv)
    assert args.func(args) == 0 and "rel L2 0.00e+00" in capsys.readouterr().out
    if path.startswith("sm90"):
        assert seen == {"name": "cuda_sm90_seesaw2", "layout": {"combine": combine}}
    else:
        cw, rg, comb, pp = kernel.MMA_LAYOUTS.get(path, kernel.default_layout())
        assert seen == {"name": "cuda", "layout": (cw, rg, comb if combine is None else combine, pp)}


def test_seesaw2_set_times_its_baseline_twice_and_every_sm90_row_names_a_schedule():
    from kdengine.ops import cuda_backend

    labels = [v[0] for v in kernel.variants(65536, 64, "seesaw2")]
    assert labels[:4] == ["cuda_sm90_staggered_small/sauto", "cuda_sm90_seesaw2/sauto", "cuda_sm90_seesaw2_bar/sauto",
                          "cuda_sm90_staggered_small/aa/sauto"]
    # the sweep's sm90 rows and sets name only schedules the kernel still has (probes are removed, not left dangling)
    assert all(s is None or s in cuda_backend.SCHEDULES for s in kernel.SM90_BACKENDS.values())
    assert all(n in cuda_backend.SCHEDULES for names, _ in kernel.SM90_SETS.values() for n in names)
    assert set(cuda_backend.SCHEDULES.values()) == set(range(len(cuda_backend.SCHEDULES)))


@pytest.mark.parametrize("bad", ["-1", "nan", "fast"])
def test_measure_rejects_a_bad_gap_naming_the_option(bad, capsys):
    with pytest.raises(SystemExit):
        kernel.build_parser().parse_args(["measure", "--out", "x.json", "--gap-ms", bad])
    assert "--gap-ms" in capsys.readouterr().err
    assert kernel.build_parser().parse_args(["measure", "--out", "x.json", "--gap-ms", "0"]).gap_ms == 0.0


@pytest.mark.parametrize("tokens,tile,row_tiles,wave,auto", [(65536, 64, 2, 132, 64), (65536, 16, 2, 132, 66),
                                                             (4096, 64, 8, 132, 16), (4096, 16, 2, 132, 16),
                                                             (16384, 64, 8, 132, 16)])
def test_nsplit_grid_counts_are_runnable_split_counts_around_auto(tokens, tile, row_tiles, wave, auto):
    grid = kernel.nsplit_grid(tokens=tokens, tile_tokens=tile, row_tiles=row_tiles, wave_blocks=wave, auto=auto)
    tiles = -(-tokens // tile)
    assert grid == sorted(set(grid)) and auto not in grid and len(grid) <= 11
    for n in grid:  # n non-empty splits of whole tiles: some k tiles a split gives exactly n, within one wave
        assert any(-(-tiles // k) == n for k in range(1, tiles + 1)), n
        assert auto // 4 <= n and n * row_tiles <= wave
    runnable = [n for n in {-(-tiles // k) for k in range(1, tiles + 1)} if auto // 4 <= n <= wave // row_tiles]
    below, above = [n for n in runnable if n < auto], [n for n in runnable if n > auto]
    if below:
        assert max(below) in grid  # auto's neighbours are always timed
    if above:
        assert min(above) in grid
    assert kernel.nsplit_grid(tokens=64, tile_tokens=64, row_tiles=1, wave_blocks=132, auto=1) == []


def test_nsplit2_set_brackets_fixed_counts_with_two_auto_rows_per_path(monkeypatch):
    from kdengine.ops import schedule

    monkeypatch.setattr(schedule, "sm_count", lambda index=None: 132)  # an H200's grid, on the CPU
    for hopper in (True, False):
        monkeypatch.setattr(kernel, "hopper", lambda h=hopper: h)
        rows = kernel.variants(65536, 16, "nsplit2")
        labels = [label for label, *_ in rows]
        assert len(set(labels)) == len(labels)
        backends = ["cuda_sm90_dispatched", "cuda"] if hopper else ["cuda"]
        assert sorted({backend for _, backend, *_ in rows}) == sorted(backends)
        for backend in backends:
            mine = [r for r in rows if r[1] == backend]
            assert mine[0][2] == mine[-1][2] == "auto" and "/aa/" in mine[-1][0]
            assert len(mine) > 3 and all(isinstance(r[2], int) for r in mine[1:-1])
            if backend == "cuda":
                assert {r[4] for r in mine} == {kernel.default_layout()}


def test_nsplit2_table_compares_the_mean_of_both_auto_rows_with_the_best_fixed_count():
    def row(us, n):
        return {"median_s": us * 1e-6, "nsplit": n, "samples": [us * 1e-6] * 3, "rel_l2": 1e-3, "floor_pct": 10.0}

    case = {"N": 65536, "T": 16, "results": {
        "p/sauto": row(10.0, 64), "p/s48": row(9.9, 48), "p/s80": row(12.0, 80), "p/aa/sauto": row(10.2, 64),
        "q/sauto": row(20.0, 66), "q/s33": row(18.0, 33), "q/aa/sauto": row(20.0, 66), "q/s50": {"error": "x"}}}
    lines = kernel.nsplit2_table({"cases": [case]})
    p = next(line for line in lines if "| p |" in line)
    q = next(line for line in lines if "| q |" in line)
    assert p.startswith("| 65k T16 |") and "9.90 (48)" in p and "1.020" in p and p.endswith("yes |")
    assert "18.00 (33)" in q and "1.111" in q and q.endswith("NO |")
    doc = _doc() | {"set": "nsplit2", "cases": [case | {"H": 8, "floor_s": 1e-6}]}
    assert p in kernel.render_doc(doc) and "auto NSPLIT against the best fixed count" in kernel.render_doc(doc)


def test_nsplit2_rows_centre_each_grid_on_that_paths_planner(monkeypatch):
    """The grid's auto is the planner's own count, its minimum split length included: on 132 SMs the mma.sync planner
    runs 4k T=16 (256 tiles of 16 tokens, 2 row tiles) as 64 splits (at 256 tokens a split it would be 16), so the
    grid spans 16 .. 66 and keeps 52, the runnable count next below 64."""
    from kdengine.ops import schedule

    monkeypatch.setattr(schedule, "sm_count", lambda index=None: 132)
    monkeypatch.setattr(kernel, "hopper", lambda: False)
    fixed = [n for _, _, n, *_ in kernel.variants(4096, 16, "nsplit2") if isinstance(n, int)]
    assert 52 in fixed and 64 not in fixed and min(fixed) >= 64 // 4 and max(fixed) <= 132 // 2
