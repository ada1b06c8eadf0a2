"""ci/gpu/sched_ab_tables.py on synthetic records: the engine line's B-against-A figure and the A/A spread it is read
against (CPU only; the device scripts' tables are what closing notes quote)."""

from __future__ import annotations

import json
import statistics

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
