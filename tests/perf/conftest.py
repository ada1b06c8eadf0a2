"""pytest-benchmark for local work (README: "Benchmarks and measurement").

Perf tests are marked `perf` and run only when asked for: a --benchmark-* storage/compare/json/only
option is given, or tests/perf is named on the command line. A plain `pytest -q` skips them, so the
default suite stays fast. Every saved run carries the machine's kdengine fingerprint in its machine_info.
"""

from __future__ import annotations

from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ASKING_OPTIONS = ("benchmark_autosave", "benchmark_save", "benchmark_compare", "benchmark_json", "benchmark_only")


def perf_requested(config) -> bool:
    if any(config.getoption(name, default=None) for name in ASKING_OPTIONS):
        return True
    return any("tests/perf" in str(arg).replace("\\", "/") for arg in config.args)


def pytest_collection_modifyitems(config, items):
    if perf_requested(config):
        return
    skip = pytest.mark.skip(reason="perf benchmark: run `pytest tests/perf` or pass --benchmark-autosave/-compare")
    for item in items:
        if HERE in Path(str(item.fspath)).resolve().parents:
            item.add_marker(skip)


def pytest_benchmark_update_machine_info(config, machine_info):
    """The machine's identity only (GPU, SMs, driver, CUDA, torch, triton): what must match for a compare
    to mean something. Clocks change from run to run (each benchmark keeps its own in extra_info) and the
    commit is pytest-benchmark's commit_info; here either would make every compare warn that the machine
    differs."""
    from kdengine.bench import fingerprint

    machine_info["kdengine"] = {**fingerprint.software(), **fingerprint.gpu(), "machine": fingerprint.machine_name()}
