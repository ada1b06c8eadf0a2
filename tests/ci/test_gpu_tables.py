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
