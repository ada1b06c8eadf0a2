"""The gate's error rates on seeded synthetic histories (noise 1-5% per sample, 20 samples per run):
false alarms on A/A pairs <= 1%, recall >= 95% for planted 5% regressions; and its speed on 1,000 commits."""

from __future__ import annotations

import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
import asvdata  # noqa: E402

from ci import gate  # noqa: E402
from ci.history import Point, Run  # noqa: E402

TRIALS = 400
N_SAMPLES = 20
HISTORY = 8


def make_history(rng, noise: float, direction: str, value: float) -> list[Run]:
    runs = []
    for i in range(HISTORY):
        s = list(value * (1 + noise * rng.standard_normal(N_SAMPLES)))
        runs.append(Run(f"{i:040x}", "m", float(i), {"w": Point(float(np.median(s)), "u", direction, s)}))
    return runs


def trial(rng, factor_worse: float) -> str:
    noise = rng.uniform(0.01, 0.05)
    direction = "lower" if rng.random() < 0.5 else "higher"
    value = rng.uniform(1e-4, 1e3)
    hist = make_history(rng, noise, direction, value)
    head_value = value * (1 + factor_worse) if direction == "lower" else value * (1 - factor_worse)
    s = list(head_value * (1 + noise * rng.standard_normal(N_SAMPLES)))
    head = Point(float(np.median(s)), "u", direction, s)
    return gate.judge("w", "m", hist[-1], head, hist, gate.load_thresholds()).verdict


def rate(verdicts: list[str], what: str) -> float:
    return sum(v == what for v in verdicts) / len(verdicts)


def test_false_alarms_on_a_a_pairs():
    rng = np.random.default_rng(1)
    false_alarm = rate([trial(rng, 0.0) for _ in range(TRIALS)], "regressed")
    print(f"A/A false alarm rate: {false_alarm:.2%} over {TRIALS} pairs")
    assert false_alarm <= 0.01


def test_recall_of_planted_5pct_regressions():
    rng = np.random.default_rng(2)
    recall = rate([trial(rng, 0.05) for _ in range(TRIALS)], "regressed")
    print(f"recall of planted 5% regressions: {recall:.2%} over {TRIALS} trials")
    assert recall >= 0.95


def test_planted_improvement_is_not_a_regression():
    rng = np.random.default_rng(3)
    verdicts = [trial(rng, -0.10) for _ in range(100)]
    assert rate(verdicts, "regressed") == 0 and rate(verdicts, "improved") >= 0.95


def test_1000_commit_history_under_2s(tmp_path):
    rng = np.random.default_rng(4)
    asvdata.write_benchmarks(tmp_path)
    for i in range(1000):
        f = 1.08 if i == 999 else 1.0
        vals = {f"verify/{b}/ctx{c}/T16": list(1e-4 * c / 4096 * f * (1 + 0.02 * rng.standard_normal(20)))
                for b in ("triton", "triton_extend") for c in (4096, 16384, 65536)}
        vals["decode/cuda/ctx4096"] = list(900 / f * (1 + 0.02 * rng.standard_normal(20)))
        asvdata.write_run(tmp_path, "gpu-x", f"{i:040x}", 1_700_000_000_000 + i * 1000, vals)
    t0 = time.perf_counter()
    result = gate.run_gate(str(tmp_path), f"{998:040x}", f"{999:040x}")
    elapsed = time.perf_counter() - t0
    print(f"gate over 1,000 commits x 7 benchmarks: {elapsed:.2f} s")
    assert elapsed < 2.0
    assert result["counts"]["regressed"] == 7
    assert all(b["change_points"] for b in result["benchmarks"])  # the head starts a step


def test_change_point_at_newest_point_counts_without_samples():
    # history without samples, flat then a 10% step at the head: E-divisive flags the newest point
    rng = np.random.default_rng(5)
    hist = [Run(f"{i:040x}", "m", float(i), {"w": Point(1.0 + 0.005 * rng.standard_normal(), "s", "lower")})
            for i in range(40)]
    v = gate.judge("w", "m", hist[-1], Point(1.10, "s", "lower"), hist, gate.load_thresholds())
    assert v.verdict == "regressed"
    assert v.change_points and v.change_points[-1]["commit"] == "head"
