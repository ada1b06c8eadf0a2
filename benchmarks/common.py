"""Shared helpers of the asv suites (append-only: suites and history depend on these names).

Every suite case maps its asv parameters to one kdengine.bench workload, skips (NotImplementedError
in setup) where the workload cannot run here, and measures it once per run: the first track_ metric
of a workload measures it and appends its record to KDENGINE_SAMPLES_OUT, later metrics of the same
workload read that record back (records carry the run's id, so runs may share one file).
"""

from __future__ import annotations

import inspect
import os
import socket

import torch

from kdengine import env
from kdengine.bench import workloads


def asv_quick() -> bool:
    """True under `asv run --quick`. asv tells only the benchmark object (its extra attributes
    number=repeat=rounds=1, warmup_time=0), so look for that object up the call stack."""
    frame = inspect.currentframe()
    while frame is not None:
        owner = frame.f_locals.get("self")
        sources = getattr(owner, "_attr_sources", None)
        if isinstance(sources, list) and sources:
            extra = sources[0]
            if type(extra).__name__ == "ExtraBenchmarkAttrs" or getattr(extra, "__name__", "") == "ExtraBenchmarkAttrs":
                return getattr(extra, "warmup_time", None) == 0 and getattr(extra, "rounds", None) == 1
            return False
        frame = frame.f_back
    return False


def require(workload: workloads.Workload) -> workloads.Workload:
    """The workload, or NotImplementedError (asv: skipped) when it cannot run on this machine.
    The CPU default runs on machines without a GPU only, so it never costs GPU-machine time."""
    if workload.device == "cpu" and torch.cuda.is_available():
        raise NotImplementedError(f"{workload.name}: the CPU default runs only on machines without a GPU")
    reason = workloads.unavailable_reason(workload)
    if reason is not None:
        raise NotImplementedError(f"{workload.name}: {reason}")
    return workload


def run_id() -> str:
    """This asv run: every benchmark process of one run shares its parent (the forkserver, or asv
    itself with the spawn launcher), so host + parent pid + commit tell runs apart."""
    return f"{socket.gethostname()}:{os.getppid()}:{env.asv_commit() or ''}"


def record(workload: workloads.Workload, asv_name: str, params: tuple) -> dict:
    """The workload's record of this run (measured now, or earlier in this run by another metric)."""
    return workloads.measure_once(workload, run_id(), quick=asv_quick(), asv_name=asv_name,
                                  asv_params=[repr(p) for p in params])


def metric(func, unit: str, direction: str):
    """Mark a track_ function with its asv unit and whether higher or lower is better; both must be what
    kdengine.bench.metrics (the one table the gate and the report read) says for this benchmark."""
    from kdengine.bench import metrics

    name = f"{func.__module__.rsplit('.', 1)[-1]}.{func.__qualname__}"
    known = metrics.lookup(name)
    if known is None or (known.unit, known.direction) != (unit, direction):
        raise ValueError(f"{name}: declared {unit} ({direction}), but kdengine.bench.metrics says "
                         f"{known or 'nothing'}: add or fix its entry there")
    func.unit = unit
    func.direction = direction
    return func
