"""The environment fingerprint recorded with every result: software versions, the GPU and its state,
and the commit. History only compares results whose comparable fields agree.
"""

from __future__ import annotations

import platform
import subprocess
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parents[2]


def _git(*args: str) -> str | None:
    try:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def software() -> dict:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
    }


def gpu() -> dict:
    if not torch.cuda.is_available():
        return {"gpu": "cpu", "sm_count": 0, "cpu": platform.processor() or platform.machine()}
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "capability": f"sm_{props.major}{props.minor}",
        "memory_gib": round(props.total_memory / 2**30, 1),
    }


def commit() -> dict:
    sha = _git("rev-parse", "HEAD")
    dirty = _git("status", "--porcelain", "--untracked-files=no")
    return {"commit": sha, "dirty": bool(dirty) if dirty is not None else None}


def collect() -> dict:
    """A flat dict: software, GPU identity, commit. (Clocks and throttling are added by the timer.)"""
    return {**software(), **gpu(), **commit()}
