"""The PTX of a kernel translation unit, compiled once per (source, arch, macros) for every test module that reads it
(tests/ops/test_ptx.py, test_sm90.py, test_timeline.py), its entries by name, and ptxas -v's spill figures of some
of them."""

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


SPILLS = re.compile(r"(\d+) bytes spill stores, (\d+) bytes spill loads")  # ptxas -v, per entry


def ptxas_spills(ptx: str, arch: str, names: list[str]) -> dict[str, tuple[int, int]]:
    """ptxas -v on the entries `names` of a PTX unit (its text before the first entry kept: target, globals):
    {entry: (spill store bytes, spill load bytes)}."""
    head = ptx[: ptx.index(".visible .entry")]
    bodies = kernel_bodies(ptx)
    done = subprocess.run(["ptxas", f"-arch=sm_{arch}", "-v", "-o", "/dev/null", "-"], input=head + "".join(
        bodies[n] for n in names), capture_output=True, text=True, check=True, timeout=300)
    found = re.findall(r"Compiling entry function '(\w+)'.*?" + SPILLS.pattern, done.stdout + done.stderr, re.S)
    return {name: (int(st), int(ld)) for name, st, ld in found}
