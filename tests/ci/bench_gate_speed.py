"""How long the gate takes on a long history: `python tests/ci/bench_gate_speed.py [--commits 1000]
[--benchmarks 60] [--repeat 5]` writes a seeded asv results directory (asv v2 files + samples sidecars, 20
samples per point) and times `ci.gate.run_gate` (loading every file, then judging the newest commit) with
time.perf_counter, median of --repeat runs. Target: <= 3 s for 1,000 commits x 60 benchmarks on a 2-core
machine. A script, not a timed unit test: tests/ci/test_gate_speed.py runs it once, small, for correctness.
"""

from __future__ import annotations

import argparse
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the ci package
import asvdata  # noqa: E402

from ci import gate  # noqa: E402

MACHINE = "gpu-speed"


def write_history(root: Path, commits: int, benchmarks: int, seed: int = 0) -> list[str]:
    """`commits` runs of `benchmarks` verify workloads; the newest is 8% slower on every benchmark."""
    rng = np.random.default_rng(seed)
    asvdata.write_benchmarks(root)
    names = [f"verify/b{i // 6}/ctx{(4096, 16384, 65536)[i % 3]}/T{(16, 64)[i // 3 % 2]}" for i in range(benchmarks)]
    shas = [hashlib.sha1(f"commit {i}".encode()).hexdigest() for i in range(commits)]
    for i, sha in enumerate(shas):
        f = 1.08 if i == commits - 1 else 1.0
        run = 1 + 0.003 * rng.standard_normal()
        vals = {n: list(1e-4 * (1 + k % 7) * f * run * (1 + 0.002 * rng.standard_normal(20)))
                for k, n in enumerate(names)}
        asvdata.write_run(root, MACHINE, sha, 1_700_000_000_000 + i * 1000, vals)
    return shas


def time_gate(root: Path, shas: list[str], repeat: int) -> tuple[float, float, dict]:
    """(median wall seconds, median CPU seconds of this process, the last result): on a shared machine the
    CPU time is the figure another job cannot inflate."""
    walls, cpus, result = [], [], {}
    for _ in range(repeat):
        t0, c0 = time.perf_counter(), time.process_time()
        result = gate.run_gate(str(root), shas[-2], shas[-1], MACHINE)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    return statistics.median(walls), statistics.median(cpus), result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--commits", type=int, default=1000)
    p.add_argument("--benchmarks", type=int, default=60)
    p.add_argument("--repeat", type=int, default=5)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        t0 = time.perf_counter()
        shas = write_history(root, args.commits, args.benchmarks)
        print(f"wrote {args.commits} commits x {args.benchmarks} benchmarks in {time.perf_counter() - t0:.1f} s")
        wall, cpu, result = time_gate(root, shas, args.repeat)
    print(f"gate: median {wall:.2f} s wall, {cpu:.2f} s CPU over {args.repeat} runs; verdicts {result['counts']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
