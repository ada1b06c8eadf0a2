"""ci.perf.confirm's rounds without asv (run_asv and the clock replaced): a row confirmed is not measured again, and the
budget stop reads the next round's cost from the last round and the rows still open, so a slowdown that needs one more
round gets it where the rounds' average (the first round pays the builds) would have stopped it."""

from __future__ import annotations

import argparse
from pathlib import Path

from ci import gate, perf

BIG, SMALL = "bench_verify.Verify.track_time('cuda', 65536, 64)", "bench_verify.Verify.track_time('cuda', 16384, 16)"
LEVELS = {BIG: (100.0, 104.0), SMALL: (18.5, 18.77)}  # (base, head): +4% and +1.5%, round medians +-0.05%


def fake_run(monkeypatch, first_round_s: float):
    """asv replaced: each call measures the named rows (a per-call cost of 10 s + 20 s per row, `first_round_s`
    more on the first round's two calls) and returns their medians; returns the list of rows named per call."""
    clock, calls = [0.0], []

    def run_asv(tree, sha, machine, out, tmp, bench, extra, verbose=False, bench_tree=None):
        names = [n for n in LEVELS if any(n in b.replace("\\", "") for b in bench)]
        calls.append((out.name, names))
        clock[0] += 10 + 20 * len(names) + (first_round_s / 2 if out.name.startswith("confirm0-") else 0)
        side = 1 if out.name.endswith("head") else 0
        jitter = 1 + 0.0005 * (-1) ** len(calls)
        return {n: LEVELS[n][side] * jitter for n in names}

    monkeypatch.setattr(perf, "run_asv", run_asv)
    monkeypatch.setattr(perf, "medians", lambda got: got)
    monkeypatch.setattr(perf, "git", lambda *a, **k: "")
    monkeypatch.setattr(perf.time, "monotonic", lambda: clock[0])
    return calls


def confirm(tmp_path: Path, budget: float) -> dict:
    rows = [{"name": n, "machine": "m", "verdict": "regressed", "unit": "seconds", "direction": "lower",
             "base": LEVELS[n][0], "head": LEVELS[n][1], "worse": LEVELS[n][1] / LEVELS[n][0] - 1, "threshold": 0.01,
             "reason": "first pass", "dof": 5, "runs": 2} for n in LEVELS]
    result = {"base": "a" * 40, "head": "b" * 40, "benchmarks": rows}
    args = argparse.Namespace(confirm_budget=budget, asv_arg=None, verbose=False)
    config = gate.load_thresholds()
    assert perf.confirm(args, result, "m", "b" * 40, tmp_path, tmp_path, tmp_path, config) is None
    return {r["name"]: r for r in rows}


def test_a_confirmed_row_is_not_measured_again_and_the_open_one_gets_its_round(tmp_path, monkeypatch):
    calls = fake_run(monkeypatch, first_round_s=120)  # round 1: 2 x 50 + 120 = 220 s, round 2: 100 s (320 s)
    rows = confirm(tmp_path, budget=400)
    # the average of two rounds (160 s) would have stopped at 320 s; the next round measures one row: ~67 s
    assert [names for _, names in calls[:4]] == [[BIG, SMALL]] * 4
    assert all(names == [SMALL] for _, names in calls[4:]) and len(calls) >= 6
    assert rows[BIG]["verdict"] == "regressed" and rows[BIG]["confirmation"]["rounds"] == 2
    assert rows[SMALL]["verdict"] == "regressed" and rows[SMALL]["confirmation"]["rounds"] >= 3


def test_the_budget_still_stops_the_rounds(tmp_path, monkeypatch):
    calls = fake_run(monkeypatch, first_round_s=120)
    rows = confirm(tmp_path, budget=330)  # after round 2 (320 s) one more round (~67 s) would pass the budget
    assert len(calls) == 4
    assert rows[BIG]["verdict"] == "regressed" and rows[SMALL]["verdict"] == "noisy"
    assert "inconclusive" in rows[SMALL]["reason"] and rows[SMALL]["confirmation"]["rounds"] == 2


def test_next_round_s_scales_with_the_rows_left():
    assert perf.next_round_s(100.0, 4, 4) == 100.0
    assert perf.next_round_s(100.0, 4, 1) == 40.0  # one row's worth of fixed cost per round
    assert perf.next_round_s(0.0, 3, 3) == 0.0
