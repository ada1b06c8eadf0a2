"""The gate-speed script (tests/ci/bench_gate_speed.py) runs and judges its planted 8% step: correctness
only; its timing is reported by the script, never asserted here."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import bench_gate_speed  # noqa: E402


def test_speed_script_finds_the_planted_step(tmp_path):
    shas = bench_gate_speed.write_history(tmp_path, commits=30, benchmarks=6)
    wall, cpu, result = bench_gate_speed.time_gate(tmp_path, shas, repeat=1)
    assert wall > 0 and cpu > 0
    assert result["counts"]["regressed"] == 6 and result["exit_code"] == 1
