"""Seeded synthetic histories for the gate's error rates: each run's median moves by the run-to-run
spread (drawn once per run), each sample by the within-run spread, and the level takes planted steps.

Profiles (relative spreads, 20 samples a run):
  drift  within-run 0.1-0.3%, run-to-run 0.5-1.0%, steps of 5%   (shared runners, host-bound benchmarks)
  quiet  within-run 0.05-0.2%, run-to-run 0.1-0.3%, steps of 2%  (graph-replayed GPU kernels)
A trial builds a history (8-40 runs, an earlier step of either sign in half of them), then a head that is
unchanged, a planted step in the bad direction, or a one-run spike that reverts (the confirmation reruns
measure the true level). The gate judges the head (first pass); suspects are confirmed by interleaved
base/head reruns until confirmed or max_rounds, exactly as `ci perf` does. Confirmation runs are drawn with
the full run-to-run spread (no session effect that ABAB would cancel): harder than a real runner.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ci import gate
from ci.history import Point, Run

PROFILES = {
    "drift": {"within": (0.001, 0.003), "between": (0.005, 0.010), "step": 0.05},
    "quiet": {"within": (0.0005, 0.002), "between": (0.001, 0.003), "step": 0.02},
}
N_SAMPLES = 20


@dataclass
class Trial:
    kind: str  # "unchanged", "step" or "spike"
    first_pass: str
    final: str


def _run(rng, i: int, level: float, within: float, between: float, direction: str) -> Run:
    offset = math.exp(between * rng.standard_normal())
    samples = list(level * offset * (1 + within * rng.standard_normal(N_SAMPLES)))
    unit = "tok/s" if direction == "higher" else "seconds"
    point = Point(float(np.median(samples)), unit, direction, samples)
    return Run(f"{i:040x}", "m", float(i), {"w": point}, has_samples=True)


def _median(rng, level, within, between) -> float:
    return float(level * math.exp(between * rng.standard_normal()) * (1 + within * rng.standard_normal() / 4))


def trial(rng, profile: str, kind: str, config: dict) -> Trial:
    p = PROFILES[profile]
    within, between = rng.uniform(*p["within"]), rng.uniform(*p["between"])
    direction = "lower" if rng.random() < 0.5 else "higher"
    worse = 1 + p["step"] if direction == "lower" else 1 / (1 + p["step"])
    level = rng.uniform(1e-4, 1e3)
    n = int(rng.integers(8, 41))
    levels = [level] * n
    if rng.random() < 0.5:  # an earlier step, either sign, at least 2 runs before the end
        at = int(rng.integers(1, n - 2))
        factor = worse if rng.random() < 0.5 else 1 / worse
        levels = levels[:at] + [lv * factor for lv in levels[at:]]
    hist = [_run(rng, i, lv, within, between, direction) for i, lv in enumerate(levels)]
    base_level = levels[-1]
    head_level = base_level * worse if kind in ("step", "spike") else base_level
    head = _run(rng, n, head_level, within, between, direction)
    row = gate.asdict(gate.judge("w", "m", hist[-1], head, hist, config))
    first = row["verdict"]
    if first in ("regressed", "noisy"):  # what `ci perf` does: rounds until confirmed, at most max_rounds
        true_head = base_level if kind == "spike" else head_level
        base_values, head_values = [], []
        for rnd in range(int(config["defaults"]["max_rounds"])):
            base_values.append(_median(rng, base_level, within, between))
            head_values.append(_median(rng, true_head, within, between))
            if rnd >= 1 and gate.confirm(dict(row), base_values, head_values, config)["verdict"] == "regressed":
                break
        gate.confirm(row, base_values, head_values, config)
    return Trial(kind, first, row["verdict"])


def rates(profile: str, kind: str, trials: int, seed: int) -> dict[str, float]:
    """{"first_<verdict>": share, "final_<verdict>": share} over `trials` seeded trials."""
    rng = np.random.default_rng(seed)
    config = gate.load_thresholds()
    config["defaults"]["threshold"] = 0.01
    out = [trial(rng, profile, kind, config) for _ in range(trials)]
    shares = {}
    for stage in ("first", "final"):
        for v in gate.VERDICTS:
            shares[f"{stage}_{v}"] = sum(getattr(t, "first_pass" if stage == "first" else "final") == v
                                         for t in out) / trials
    return shares
