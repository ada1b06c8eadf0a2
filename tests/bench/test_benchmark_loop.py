"""The local pytest-benchmark loop of the README, proven on the CPU: autosave, then a planted 2x
slowdown fails `--benchmark-compare-fail=median:5%` and an unchanged run passes.

The planted benchmark runs under a planted clock (`--benchmark-timer planted_clock.now`) that
advances with the work done, so the verdicts test the loop itself (save, compare, threshold, exit
status) and not the load of the shared CI machine.
"""

from __future__ import annotations

import os
import subprocess
import sys

CLOCK = '''
"""A virtual clock: each read ticks 1 ns, each unit of planted work adds 1 us."""
_now = 0.0


def now():
    global _now
    _now += 1e-9
    return _now


def spend(units):
    global _now
    _now += units * 1e-6
'''

PLANTED = '''
import os

import planted_clock


def work(n):
    planted_clock.spend(n)
    return sum(i * i for i in range(100))


def test_planted(benchmark):
    n = 1000 * int(os.environ.get("PLANTED_FACTOR", "1"))
    benchmark.pedantic(work, args=(n,), rounds=20, warmup_rounds=1, iterations=1)
'''


def run_pytest(tmp_path, factor: int, *options: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PLANTED_FACTOR": str(factor), "PYTHONPATH": str(tmp_path)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "--benchmark-storage", str(tmp_path / "store"), "--benchmark-timer", "planted_clock.now",
           "test_planted.py", *options]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_autosave_then_compare_catches_a_2x_slowdown(tmp_path):
    (tmp_path / "planted_clock.py").write_text(CLOCK)
    (tmp_path / "test_planted.py").write_text(PLANTED)
    saved = run_pytest(tmp_path, 1, "--benchmark-autosave")
    assert saved.returncode == 0, saved.stdout + saved.stderr
    assert list((tmp_path / "store").rglob("0001_*.json")), "autosave wrote no run"
    slow = run_pytest(tmp_path, 2, "--benchmark-compare", "--benchmark-compare-fail=median:5%")
    assert slow.returncode != 0, slow.stdout
    assert "Performance has regressed" in slow.stdout + slow.stderr
    same = run_pytest(tmp_path, 1, "--benchmark-compare", "--benchmark-compare-fail=median:5%")
    assert same.returncode == 0, same.stdout + same.stderr
    assert "Comparing against benchmarks from" in same.stdout + same.stderr


SAMPLED = '''
import os
import time

import pytest

from kdengine.bench import timer


class Planted:
    """A sampler's own clock: each sample "measures" 1 ms x FACTOR, whatever the host does around it."""

    def __init__(self, factor):
        self.now, self.factor = 0.0, factor

    def __call__(self):
        return self.now

    def work(self):
        self.now += 1e-3 * self.factor
        time.sleep(0.002)  # host time, inside the harness's round but outside the measured sample


@pytest.mark.benchmark(timer=timer.sample_clock)
def test_sampled(benchmark):
    planted = Planted(int(os.environ.get("PLANTED_FACTOR", "1")))
    sample = timer.cpu_sampler(planted.work, clock=planted)
    benchmark.pedantic(sample, rounds=15, warmup_rounds=1, iterations=1)
'''


def run_sampled(tmp_path, factor: int, *options: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PLANTED_FACTOR": str(factor)}
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-o", "addopts=",
           "--benchmark-storage", str(tmp_path / "store"), "test_sampled.py", *options]
    return subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


def test_sample_clock_makes_the_statistics_the_samples(tmp_path):
    """Under `timer=sample_clock` the saved statistics are the samples' own times (1 ms), not the
    rounds' host time (~3 ms with the planted sleep); a rerun compares equal, a 2x slowdown fails."""
    import json

    (tmp_path / "test_sampled.py").write_text(SAMPLED)
    saved = run_sampled(tmp_path, 1, "--benchmark-autosave")
    assert saved.returncode == 0, saved.stdout + saved.stderr
    (path,) = (tmp_path / "store").rglob("0001_*.json")
    bench = json.loads(path.read_text())["benchmarks"][0]
    assert bench["options"]["timer"].endswith("sample_clock")
    assert abs(bench["stats"]["median"] - 1e-3) < 1e-12 and bench["stats"]["rounds"] == 15
    same = run_sampled(tmp_path, 1, "--benchmark-compare", "--benchmark-compare-fail=median:5%")
    assert same.returncode == 0, same.stdout + same.stderr
    slow = run_sampled(tmp_path, 2, "--benchmark-compare", "--benchmark-compare-fail=median:5%")
    assert slow.returncode != 0 and "Performance has regressed" in slow.stdout + slow.stderr
