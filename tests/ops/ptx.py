"""The PTX of a kernel translation unit, compiled once per (source, arch, macros) for every test module that reads it
(tests/ops/test_ptx.py, test_sm90.py, test_timeline.py), and its entries by name."""

from __future__ import annotations

import re
import subprocess
from functools import cache

from kdengine.ops import build


@cache
def unit_ptx(source: str, arch: str, defines: tuple[str, ...] = ()) -> str:
    """PTX of csrc/`source` (a torch-free .cu) for sm_`arch`, with -D of each macro in `defines`."""
    cmd = ["nvcc", "-ptx", *(f"-D{d}" for d in defines), "-std=c++17", "-O3", f"-arch=sm_{arch}", "-o", "-",
           str(build.CSRC / source)]
    return subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=300).stdout


def kernel_bodies(ptx: str) -> dict[str, str]:
    """Each entry's PTX (its directives and body) by mangled name."""
    entries = re.split(r"(?=\.visible \.entry)", ptx)
    return {e.split("(")[0].split()[-1]: e for e in entries if e.startswith(".visible .entry")}
