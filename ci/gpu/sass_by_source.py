"""Loops of an sm90 verify kernel attributed to source: each SASS instruction in a loop's span to the function or
lambda of csrc/verify_sm90.cuh that holds its innermost line ("body": verify_sm90_body itself). Static counts: what
the loop's code is made of, not what a step runs (ncu's per-instruction counters say that).

    nvcc -O3 -std=c++17 --expt-relaxed-constexpr -lineinfo -gencode=arch=compute_90a,code=sm_90a -cubin -Icsrc \\
        csrc/verify_sm90.cu -o k.cubin && nvdisasm -g -c k.cubin > k.txt
    python ci/gpu/sass_loops.py k.txt cappedILi7                       (the loops' spans)
    python ci/gpu/sass_by_source.py k.txt cappedILi7 0xFIRST-0xLAST ... (one column per span)
"""

from __future__ import annotations

import re
import sys
from collections import Counter
from pathlib import Path

from sass_loops import INSTR  # (this directory: run as a script)

SOURCE = Path(__file__).resolve().parents[2] / "csrc" / "verify_sm90.cuh"
FUNC = re.compile(r"(?:template <[^>]*>\s*)?__device__ __forceinline__ [\w:<>,&\s*]+?\b(\w+)\(")
LAMBDA = re.compile(r"\s+auto (\w+) = \[&\]")
LAMBDA_LINES = 12  # a line this far past a lambda's start belongs to the body again (the lambdas are short)


def owners(lines: list[str]) -> list[tuple[int, str]]:
    """(first line, name) of every device function and lambda, in order."""
    out = []
    for i, line in enumerate(lines, 1):
        if m := FUNC.match(line):
            out.append((i, "body" if m.group(1) == "verify_sm90_body" else m.group(1)))
        elif m := LAMBDA.match(line):
            out.append((i, "lambda " + m.group(1)))
    return out


def owner(starts: list[tuple[int, str]], path: str, line: int) -> str:
    if not path.endswith(SOURCE.name):
        return Path(path).name
    best, at = "?", 0
    for i, name in starts:
        if i <= line:
            best, at = name, i
    return "body" if best.startswith("lambda") and line - at > LAMBDA_LINES else best


def section(text: str, pattern: str) -> str:
    """The .text section of the one kernel matching `pattern` in an nvdisasm listing."""
    parts = re.split(r"(?m)^(?=\s*\.section\s+\.text\.)", text)
    found = [p for p in parts if re.match(r"\s*\.section\s+\.text\.\S*" + pattern, p)]
    if len(found) != 1:
        sys.exit(f"{pattern}: {len(found)} kernels' .text sections match")
    return found[0]


def attribute(text: str, lo: int, hi: int, starts: list[tuple[int, str]]) -> Counter:
    where, out = None, Counter()
    for line in text.splitlines():
        if m := re.search(r'File "([^"]+)", line (\d+)', line):
            where = (m.group(1), int(m.group(2)))
        elif (m := INSTR.search(line)) and where and lo <= int(m.group(1), 16) <= hi:
            out[owner(starts, *where)] += 1
    return out


def main(argv: list[str]) -> None:
    if len(argv) < 3:
        sys.exit(__doc__)
    text = section(Path(argv[0]).read_text(errors="replace"), argv[1])
    starts = owners(SOURCE.read_text().splitlines())
    cols = [attribute(text, *(int(x, 16) for x in span.split("-")), starts) for span in argv[2:]]
    names = sorted({k for c in cols for k in c}, key=lambda k: (-sum(c[k] for c in cols), k))
    print(f"{'source (function / lambda; body = verify_sm90_body)':52s}" + "".join(f"{s:>16s}" for s in argv[2:]))
    for k in names:
        print(f"{k:52s}" + "".join(f"{c[k]:16d}" for c in cols))
    print(f"{'total':52s}" + "".join(f"{sum(c.values()):16d}" for c in cols))


if __name__ == "__main__":
    main(sys.argv[1:])
