"""The one module that reads environment variables. Everything else asks this module.

Variables:
  KDENGINE_NSPLIT      `auto` or a positive integer: overrides the default KV split count of the
                       split-KV verify backends without a rebuild (an explicit `nsplit=` argument wins).
  KDENGINE_CACHE_DIR   where JIT builds and measured machine ceilings are cached
                       (default ~/.cache/kdengine).
  KDENGINE_BACKEND     default backend for `verify_attention(backend="auto")` callers that want to
                       pin one (e.g. `triton`), mostly for A/B runs of the engine.
  KDENGINE_SAMPLES_OUT path of a JSONL file the benchmarks append one record per measured workload
                       to (per-sample values for perf_history/samples/); unset = not written.
  KDENGINE_CUDA_PATH   `mma`, `sm90` or `auto`: which split kernel the cuda backend runs (mma.sync on
                       every arch, or the Hopper wgmma path on sm_90); unset = the backend default.
  ASV_COMMIT           set by asv for the benchmarks it runs (the commit being measured); read-only.
  KDENGINE_BENCH_SAMPLES  positive integer: samples per workload in kdengine.bench (overrides the
                       workload default; the GPU timer still takes at least its minimum).
  KDENGINE_TIMELINE    `1`: the cuda backend loads the in-kernel timeline build (csrc/verify_timeline.cuh,
                       `python -m kdengine.ops.build --timeline`) in place of the normal one; unset or `0`: not.
  WORLD_SIZE, LOCAL_RANK  set by torchrun in each process it launches (read-only): the tensor-
                       parallel launch path (kdengine.engine.parallel) relaunches itself when unset.

KDENGINE_BACKEND, KDENGINE_CUDA_PATH, KDENGINE_NSPLIT and KDENGINE_TIMELINE change what a benchmark measures: every result's
fingerprint records the ones that are set (`overrides`), and the gate never compares runs that differ there.
"""

from __future__ import annotations

import os
from pathlib import Path

NSPLIT_VAR = "KDENGINE_NSPLIT"
CACHE_DIR_VAR = "KDENGINE_CACHE_DIR"
BACKEND_VAR = "KDENGINE_BACKEND"
SAMPLES_OUT_VAR = "KDENGINE_SAMPLES_OUT"
BENCH_SAMPLES_VAR = "KDENGINE_BENCH_SAMPLES"
CUDA_PATH_VAR = "KDENGINE_CUDA_PATH"
CUDA_PATHS = ("mma", "sm90", "auto")
TIMELINE_VAR = "KDENGINE_TIMELINE"
# The variables above that change what a benchmark measures (not how many samples, nor where files go):
# recorded in every result's fingerprint (kdengine.bench.fingerprint) so history never compares a run made
# under an override with one made without it.
MEASUREMENT_VARS = (BACKEND_VAR, CUDA_PATH_VAR, NSPLIT_VAR, TIMELINE_VAR)


def nsplit_override() -> int | str | None:
    """The KDENGINE_NSPLIT value: None (unset/empty), "auto", or a positive int.

    Raises ValueError naming the variable for anything else (zero, negative, not an integer).
    """
    raw = os.environ.get(NSPLIT_VAR, "").strip()
    if not raw:
        return None
    if raw.lower() == "auto":
        return "auto"
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(
            f"{NSPLIT_VAR}: expected 'auto' or a positive integer, got {raw!r}"
        ) from None
    if value < 1:
        raise ValueError(f"{NSPLIT_VAR}: expected 'auto' or an integer >= 1, got {value}")
    return value


def cache_dir() -> Path:
    """Directory for JIT builds and cached measurements (created on demand)."""
    raw = os.environ.get(CACHE_DIR_VAR, "").strip()
    path = Path(raw).expanduser() if raw else Path.home() / ".cache" / "kdengine"
    path.mkdir(parents=True, exist_ok=True)
    return path


def backend_override() -> str | None:
    raw = os.environ.get(BACKEND_VAR, "").strip()
    return raw or None


def cuda_path_override() -> str | None:
    """The KDENGINE_CUDA_PATH value (None when unset); ValueError naming the variable otherwise."""
    raw = os.environ.get(CUDA_PATH_VAR, "").strip().lower()
    if not raw:
        return None
    if raw not in CUDA_PATHS:
        raise ValueError(f"{CUDA_PATH_VAR}: expected one of {CUDA_PATHS}, got {raw!r}")
    return raw


def timeline_build() -> bool:
    """KDENGINE_TIMELINE: True for `1`, False when unset, empty or `0`; ValueError naming the variable otherwise."""
    raw = os.environ.get(TIMELINE_VAR, "").strip()
    if raw not in ("", "0", "1"):
        raise ValueError(f"{TIMELINE_VAR}: expected 1 or 0, got {raw!r}")
    return raw == "1"


def measurement_overrides() -> str:
    """The MEASUREMENT_VARS that are set, as "NAME=value" joined by "," in name order ("" when none): raw
    values, so a bad one is recorded as given (the backend that reads it raises on it)."""
    return ",".join(f"{name}={os.environ[name].strip()}" for name in sorted(MEASUREMENT_VARS)
                    if os.environ.get(name, "").strip())


def triton_interpret() -> bool:
    """True when Triton runs in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "") == "1"


def samples_out() -> Path | None:
    """The KDENGINE_SAMPLES_OUT path (JSONL of per-workload samples), or None when unset."""
    raw = os.environ.get(SAMPLES_OUT_VAR, "").strip()
    return Path(raw).expanduser() if raw else None


def bench_samples() -> int | None:
    """The KDENGINE_BENCH_SAMPLES value: None (unset) or a positive int; ValueError otherwise."""
    raw = os.environ.get(BENCH_SAMPLES_VAR, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{BENCH_SAMPLES_VAR}: expected a positive integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{BENCH_SAMPLES_VAR}: expected an integer >= 1, got {value}")
    return value


def asv_commit() -> str | None:
    """The commit asv is benchmarking (ASV_COMMIT, set by asv in benchmark processes), or None."""
    raw = os.environ.get("ASV_COMMIT", "").strip()
    return raw or None


def launcher_world_size() -> int | None:
    """WORLD_SIZE as set by torchrun (processes in the job), or None outside a launcher."""
    raw = os.environ.get("WORLD_SIZE", "").strip()
    return int(raw) if raw.isdigit() else None


def launcher_local_rank() -> int | None:
    """LOCAL_RANK as set by torchrun (this process's index on its host), or None outside a launcher."""
    raw = os.environ.get("LOCAL_RANK", "").strip()
    return int(raw) if raw.isdigit() else None
