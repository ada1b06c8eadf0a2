"""ci/gpu/sched_ab_tables.py on synthetic records: the engine line's B-against-A figure and the A/A spread it is read
against (CPU only; the device scripts' tables are what closing notes quote); ci/gpu/gate_tables.py on a stored gate
run; ci/gpu/targets.py: the README's targets table against the committed records, its verdicts on synthetic ones;
ci/gpu/final_summary.py: each full device run's summary.txt against its committed records."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

import pytest

from ci.gpu import sched_ab_tables as tables


def aa_record(path, runs: dict[str, list[float]]) -> None:
    decode = {f"decode{ctx}/FLAG=0/{i}": {"tok_per_s": x} for ctx, xs in runs.items() for i, x in enumerate(xs)}
    path.write_text(json.dumps({"rows": ["a"], "sizes": {}, "decode": decode}))


def test_engine_sd_pools_each_record_against_its_own_mean(tmp_path):
    # two sets at one context with different levels: only the spread inside each set counts, not the step between
    aa_record(tmp_path / "aa_engine_1.json", {"65536": [100.0, 101.0, 99.0, 100.0]})
    aa_record(tmp_path / "aa_engine_2.json", {"65536": [200.0, 202.0, 198.0, 200.0], "4096": [50.0]})
    sd = tables.engine_sd(tmp_path)
    assert set(sd) == {"65536"}  # one run at 4096 says nothing of a spread
    assert sd["65536"] == pytest.approx(statistics.stdev([0.0, 1.0, -1.0, 0.0] * 2), rel=1e-9)
    assert tables.engine_sd(tmp_path / "none") == {}


def test_engine_line_compares_the_b_runs_with_the_a_runs():
    runs = {"decode65536/F=0/0": {"tok_per_s": 1000.0}, "decode65536/F=1/0": {"tok_per_s": 1010.0},
            "decode65536/F=1/1": {"tok_per_s": 1012.0}, "decode65536/F=0/1": {"tok_per_s": 1002.0}}
    line = tables.engine_line("65536", runs, {"65536": 0.27})
    assert line.startswith("- decode 65536: F=0/0 1000.0 tok/s, F=1/0 1010.0 tok/s")
    assert "B against A +1.00%" in line and "sd here 0.27%" in line
    # an A/A form (no B runs) gets no comparison
    aa = {k: v for k, v in runs.items() if "=0/" in k}
    assert "against" not in tables.engine_line("65536", aa, {"65536": 0.27})


def write_replay(path, blocks: dict[int, dict[int, int]]) -> None:
    """One replay's timeline CSV: blocks = {block: {kind: t_ns}}."""
    rows = [f"{kind},{b},{b},{t}" for b, marks in blocks.items() for kind, t in marks.items()]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("kind,block,smid,t_ns\n" + "\n".join(rows) + "\n")


def test_the_prologue_table_measures_from_each_block_entry_where_the_build_records_it(tmp_path):
    """A build that issues its loads ahead of the first barrier (negative times since the start) compares with one
    that does not only from the blocks' entries: where entry marks exist they are the origin, else the start."""
    from kdengine.bench import timeline as tl

    T0 = 10**12
    for rep, shift in enumerate((0, 100)):  # two replays; the second's marks 100 ns later in every block
        write_replay(tmp_path / "base" / f"timeline_65536_T16_{rep}.csv", {  # no entry marks: since the start
            b: {tl.SPLIT_START: T0 + 50 * b, tl.SPLIT_ISSUED: T0 + 50 * b + 2000 + shift,
                tl.SPLIT_S0: T0 + 50 * b + 4000 + shift} for b in range(3)})
        write_replay(tmp_path / "probe" / f"timeline_65536_T16_{rep}.csv", {  # entry 1 us before the start
            b: {tl.SPLIT_ENTRY: T0 + 50 * b, tl.SPLIT_ISSUED: T0 + 50 * b + 800 + shift,
                tl.SPLIT_START: T0 + 50 * b + 1000, tl.SPLIT_S0: T0 + 50 * b + 3000 + shift,
                tl.SPLIT_SISSUE0_A: 4000 + 1000 * b + shift} for b in range(3)})  # a duration, not a time
    origin, marks = tables.prologue(tmp_path / "probe" / "timeline_65536_T16_1.csv")
    assert origin == "entry" and marks[tl.SPLIT_START] == 1.0 and marks[tl.SPLIT_S0] == pytest.approx(3.1)
    assert tl.SPLIT_Q_ISSUED not in marks  # recorded by no block
    table = tables.prologue_table(tmp_path)
    cols = list(tables.PROLOGUE_COLUMNS)
    base, probe = (dict(zip(cols, line.strip("| ").split(" | ")[1:], strict=True)) for line in table[2:])
    assert table[2].startswith("| base 65k T16: start |") and table[3].startswith("| probe 65k T16: entry |")
    assert (base[tl.SPLIT_START], base[tl.SPLIT_ISSUED], base[tl.SPLIT_S0]) == ("0.00", "2.05", "4.05")
    assert (probe[tl.SPLIT_START], probe[tl.SPLIT_ISSUED], probe[tl.SPLIT_S0]) == ("1.00", "0.85", "3.05")
    assert base[tl.SPLIT_Q_ISSUED] == "-" and base[tl.SPLIT_SISSUE0_A] == "-"
    assert probe[tl.SPLIT_SISSUE0_A] == "5.05"  # medians 5.0, 5.1 us of the blocks' own sums


def test_gate_tables_prints_each_stored_row_with_its_rounds():
    """ci/gpu/gate_tables.py on a stored H200 gate run: every row, its rounds in the order measured, the verdicts."""
    from pathlib import Path

    from ci.gpu import gate_tables

    path = Path(__file__).parents[2] / "perf_history/gate/gpu_rounds_610a14a/run1_ecffc9afcb.json"
    doc = json.loads(path.read_text())
    text = gate_tables.table(str(path))
    rows = [line for line in text.splitlines() if line.startswith("| verify/")]
    assert len(rows) == len(doc["benchmarks"]) == 8
    for b in doc["benchmarks"]:
        line = next(r for r in rows if r.startswith(f"| {b['name']} |"))
        cells = [c.strip() for c in line.strip("|").split("|")]
        assert cells[-1] == b["verdict"]
        assert float(cells[1]) == pytest.approx(b["base"] * 1e6, abs=0.005)
        c = b.get("confirmation")
        if c:  # one figure per round on each side, in the order measured
            base, head = cells[5].split(" / ")
            assert [float(x) for x in base.split()] == pytest.approx([x * 1e6 for x in c["base"]], abs=0.005)
            assert len(head.split()) == c["rounds"]
        else:
            assert cells[5] == "-"
    assert f"exit {doc['exit_code']}" in text.splitlines()[0]


def test_readme_targets_block_is_what_the_committed_records_give():
    """The README's targets table is generated from perf_history/kernel (a new record without the regenerated table
    fails here), and it reads the latest `peers` record: its commit is named in the block."""
    from ci.gpu import targets

    assert targets.main(["--check", str(targets.ROOT / "README.md")]) == 0
    runs = targets.latest("*_peers*.json", "peers")
    assert f"`peers` {'runs' if len(runs) > 1 else 'record'} of {runs[-1]['fingerprint']['commit'][:7]}" in targets.table()


def _peers_doc(cuda_us, peer_us, mma_us, torch_us=500.0):
    def row(us):
        return {"median_s": us * 1e-6}

    cases = [{"N": N, "T": T, "results": {"cuda": row(c), "flashmla": row(p), "mma/sauto": row(m), "torch": row(torch_us)}}
             for (N, T), c, p, m in zip(((4096, 16), (4096, 64), (16384, 16), (16384, 64), (65536, 16), (65536, 64)),
                                        cuda_us, peer_us, mma_us, strict=True)]
    return {"default_label": "mma/sauto", "cases": cases}


def test_target_rows_mark_each_target_met_or_missed_from_the_figures():
    from ci.gpu import targets

    doc = _peers_doc(cuda_us=(12, 20, 25, 40, 39, 120), peer_us=(20, 19, 40, 50, 56, 118), mma_us=(1, 1, 1, 1, 69, 261))
    rows = {t: (m, ok) for t, m, ok in targets.rows_peers(doc)}
    assert rows["sm90 65k T=16 <= 40 us"] == ("39.0 us", True)
    assert rows["sm90 65k T=64 <= 115 us"] == ("120.0 us", False)
    assert rows["sm90 65k T=16 >= 1.4x FlashMLA"][1] is True  # 56 / 39 = 1.436
    assert rows["sm90 65k T=64 >= 1.07x FlashMLA"][1] is False
    assert rows["sm90 no slower than FlashMLA at any size"] == ("lowest 0.950x (4k T=64), 6 sizes", False)
    assert rows["sm90 65k T=16 >= 4x the unfused bf16 torch"] == ("12.82x", True)
    assert rows["mma.sync 65k T=16 <= 70 us (H200)"][1] is True and rows["mma.sync 65k T=64 <= 260 us (H200)"][1] is False
    del doc["cases"][4]["results"]["flashmla"]  # a row the run could not time: no verdict, not a pass
    rows = {t: (m, ok) for t, m, ok in targets.rows_peers(doc)}
    assert rows["sm90 65k T=16 >= 1.4x FlashMLA"] == ("-", None)


def test_nsplit_rows_take_the_worst_size_of_each_path_over_the_passes():
    from ci.gpu import targets

    def doc(auto, aa, fixed):
        res = {"cuda_sm90_dispatched/sauto": {"median_s": auto}, "cuda_sm90_dispatched/aa/sauto": {"median_s": aa},
               "cuda_sm90_dispatched/s48": {"median_s": fixed}, "cuda/cw16/sauto": {"median_s": 1.0},
               "cuda/cw16/aa/sauto": {"median_s": 1.0}, "cuda/cw16/s8": {"median_s": 2.0}}
        return {"cases": [{"N": 65536, "T": 16, "results": res}]}

    rows = targets.rows_nsplit([doc(1.0, 1.0, 1.0), doc(1.05, 1.03, 1.0)])
    assert rows[0] == ("sm90: auto NSPLIT within 3% of the best fixed count", "worst 1.040x the best (65k T=16), "
                       "2 passes", False)
    assert rows[1][0].startswith("mma.sync") and rows[1][2] is True


def test_targets_write_refuses_a_file_without_the_markers(tmp_path):
    from ci.gpu import targets

    path = tmp_path / "README.md"
    path.write_text("# no markers\n")
    with pytest.raises(SystemExit, match="markers"):
        targets.main(["--write", str(path)])
    assert path.read_text() == "# no markers\n"
    assert targets.main(["--check", str(tmp_path / "missing.md")]) == 2


def test_target_rows_over_several_runs_use_the_median_and_show_the_range():
    """Three runs of one commit: FlashMLA's run-to-run drift moves the 65k T=64 ratio across 1.07; the verdict is the
    median run's, and the row shows the runs' range."""
    from ci.gpu import targets

    cuda = (12, 20, 25, 40, 39, 110)
    runs = [_peers_doc(cuda_us=cuda, peer_us=(20, 19, 40, 50, 56, p), mma_us=(1, 1, 1, 1, 69, 261))
            for p in (116.0, 119.9, 121.0)]
    rows = {t: (m, ok) for t, m, ok in targets.rows_peers(runs)}
    assert rows["sm90 65k T=64 >= 1.07x FlashMLA"] == ("1.090x (110.0 against 119.9 us) (runs 1.055x-1.100x)", True)
    assert rows["sm90 65k T=64 <= 115 us"] == ("110.0 us (runs 110.0-110.0)", True)
    runs[1]["cases"][5]["results"]["flashmla"]["median_s"] = 116.5e-6  # now the median run is under 1.07x
    assert targets.rows_peers(runs)[5][2] is False


def test_merge_row_is_the_worst_size_of_the_call_less_its_split_kernel():
    from ci.gpu import targets

    def run(extra):
        cases = [{"N": N, "T": T, "results": {targets.MERGE: {"median_s": (20 + d) * 1e-6},
                                              targets.SPLIT_ONLY: {"median_s": 20e-6}}}
                 for (N, T), d in zip(targets.SIZES, (2.0, 2.5, 2.9, 3.0, 2.0, extra), strict=True)]
        return {"cases": cases}

    (name, measured, ok), = targets.rows_merge([run(3.4), run(2.8), run(3.2)])  # 65k T=64: median of 3.4, 2.8, 3.2
    assert measured == "worst 3.2 us (65k T=64); 2.0-3.2 us over 6 sizes, 3 runs" and ok is False
    assert targets.rows_merge([run(2.9)])[0][2] is True
    assert targets.rows_merge([]) == []


def test_merge_ab_refuses_one_merge_named_twice(tmp_path):
    """ci/gpu/merge_ab.py --merges A B times A B B A: the same merge twice would be an A/A pair read as an A/B one."""
    root = Path(__file__).resolve().parents[2]
    run = subprocess.run([sys.executable, "ci/gpu/merge_ab.py", "--out", str(tmp_path / "x.json"), "--merges", "7", "7"],
                         cwd=root, env={"PYTHONPATH": str(root), "PATH": ""}, capture_output=True, text=True, timeout=120)
    assert run.returncode == 2 and "--merges: name two different merges" in run.stderr
    assert not (tmp_path / "x.json").exists()


def _ncu_csv(path, launches: list[dict[str, tuple[str, str]]]) -> None:
    """An `ncu --csv --metrics` report: ncu's own lines, then one row per launch and metric (value, unit)."""
    head = ["ID", "Process ID", "Process Name", "Host Name", "Kernel Name", "Context", "Stream", "Block Size",
            "Grid Size", "Device", "CC", "Section Name", "Metric Name", "Metric Unit", "Metric Value"]
    lines = ["==PROF== Connected to process 1", ",".join(f'"{h}"' for h in head)]
    for i, metrics in enumerate(launches):
        for name, (unit, value) in metrics.items():
            row = [str(i), "1", "python3", "h", "k", "1", "7", "(256, 1, 1)", "(2, 64, 1)", "0", "9.0", "", name, unit,
                   value]
            lines.append(",".join(f'"{c}"' for c in row))
    path.write_text("\n".join(lines) + "\n")


def test_ncu_table_reads_the_first_launch_in_us_and_orders_the_stalls(tmp_path):
    from ci.gpu import ncu_table

    stall = "smsp__average_warps_issue_stalled_{}_per_issue_active.ratio".format
    _ncu_csv(tmp_path / "sm90_T16.csv", [
        {"gpu__time_duration.sum": ("ns", "42,690"), stall("wait"): ("inst", "1.90"), stall("selected"): ("inst", "1"),
         stall("long_scoreboard"): ("inst", "4.04"), "gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed": ("%", "38.11")},
        {"gpu__time_duration.sum": ("usecond", "6.59"), stall("wait"): ("inst", "9.00")}])  # the merge: not read
    _ncu_csv(tmp_path / "mma_T64.csv", [{"gpu__time_duration.sum": ("msecond", "0.28656"), stall("wait"): ("inst", "2.30")}])
    (tmp_path / "flashmla_T16.csv").write_text("==ERROR== no kernel profiled\n")
    assert ncu_table.read(tmp_path / "sm90_T16.csv")["gpu__time_duration.sum"] == pytest.approx(42.69)
    assert ncu_table.read(tmp_path / "mma_T64.csv")["gpu__time_duration.sum"] == pytest.approx(286.56)
    root = Path(__file__).resolve().parents[2]
    env = {"PYTHONPATH": str(root), "PATH": ""}  # (run as the device runs it: the repository on the path)
    out = subprocess.run([sys.executable, "ci/gpu/ncu_table.py", str(tmp_path)], capture_output=True, text=True,
                         check=True, cwd=root, env=env).stdout.splitlines()
    assert out[0].endswith("stalls per issue (long_scoreboard, wait) |")  # by their largest value, largest first
    row = next(line for line in out if "sm90 default" in line)
    assert row.startswith("| T=16 | sm90 default (dispatched) | 42.69 | - | - | - | 38.11 | 4.04, 1.90 |")
    assert "| T=64 | mma.sync default | 286.56 |" in next(line for line in out if "mma.sync" in line)
    assert next(line for line in out if "FlashMLA" in line).endswith("no report |")
    assert subprocess.run([sys.executable, "ci/gpu/ncu_table.py"], capture_output=True, cwd=root, env=env).returncode == 2


@pytest.mark.parametrize("folder", sorted(p.name for p in (Path(__file__).resolve().parents[2] / "perf_history" / "kernel")
                                          .glob("final_*") if (p / "summary.txt").exists()))
def test_final_summary_is_what_the_committed_records_give(folder):
    """A full device run's summary.txt (quoted by notes and the README) is the script's reading of the records, not
    an edited copy."""
    root = Path(__file__).resolve().parents[2]
    got = subprocess.run([sys.executable, "ci/gpu/final_summary.py", folder.removeprefix("final_")], cwd=root,
                         env={"PYTHONPATH": str(root), "PATH": ""}, capture_output=True, text=True, check=True).stdout
    assert got == (root / "perf_history" / "kernel" / folder / "summary.txt").read_text()
