"""The one table of units and directions (kdengine.bench.metrics): every asv metric the suites define is
in it, a suite that declares something else fails at import, and the sidecar refuses what it does not know."""

from __future__ import annotations

import importlib
import inspect

import pytest

from benchmarks import common
from kdengine.bench import metrics

SUITES = ("benchmarks.bench_verify", "benchmarks.bench_decode", "benchmarks.bench_tp")


def suite_metrics() -> dict[str, tuple[str, str]]:
    found = {}
    for module_name in SUITES:
        module = importlib.import_module(module_name)
        for cls_name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            for meth_name, meth in vars(cls).items():
                if meth_name.startswith("track_"):
                    found[f"{module_name.rsplit('.', 1)[-1]}.{cls_name}.{meth_name}"] = (meth.unit, meth.direction)
    return found


def test_every_suite_metric_is_in_the_table_with_its_unit_and_direction():
    found = suite_metrics()
    assert len(found) >= 15
    for name, (unit, direction) in found.items():
        assert metrics.lookup(name) == metrics.Metric(unit, direction), name


def test_a_suite_declaring_another_direction_fails_loudly():
    def track_time(self):
        return 1.0

    track_time.__module__ = "benchmarks.bench_verify"
    track_time.__qualname__ = "Verify.track_time"
    with pytest.raises(ValueError, match="kdengine.bench.metrics"):
        common.metric(track_time, "seconds", "higher")
    track_time.__qualname__ = "Verify.track_unknown"
    with pytest.raises(ValueError, match="add or fix"):
        common.metric(track_time, "seconds", "lower")


@pytest.mark.parametrize("unit,direction", [("furlongs", "lower"), ("seconds", "LOWER"), ("tok/s", "sideways")])
def test_unknown_unit_or_direction_names_where(unit, direction):
    with pytest.raises(ValueError, match="where"):
        metrics.check_unit(unit, direction, "where")
