"""Instruction counts of the sm90 verify kernels in a SASS listing (`cuobjdump -sass X.o` or
`nvdisasm -c X.cubin`): per kernel, all instructions and each backward branch's span (the loops; spans
of out-of-line retry paths show up too: read the HGMMA / FMUL columns to find the consumer's main loop).

    python ci/gpu/sass_loops.py LISTING [kernel-regex]
    python ci/gpu/sass_loops.py --compare LISTING:kernel-regex:0xLOOP ...   opcode counts of loops side by side
                                                                          (0xLOOP: a loop's first address above)
"""

from __future__ import annotations

import re
import sys
from collections import Counter

INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")
HEADER = re.compile(r"(?:Function : |\.text\.)(_Z\w+)")


def kernels(text: str) -> dict[str, list[tuple[int, str, str]]]:
    """kernel -> [(address, opcode, operands)], branch targets as 0x addresses (nvdisasm's labels resolved)."""
    out: dict[str, list[tuple[int, str, str]]] = {}
    labels: dict[str, dict[str, int]] = {}
    name, pending = None, []
    for line in text.splitlines():
        m = HEADER.search(line)
        if m and "/*" not in line:
            name, pending = m.group(1), []
            out.setdefault(name, [])
            labels.setdefault(name, {})
            continue
        m = re.match(r"\s*(\.L_x_\d+):", line)
        if m and name is not None:
            pending.append(m.group(1))
            continue
        m = INSTR.search(line)
        if m and name is not None:
            for lab in pending:
                labels[name][lab] = int(m.group(1), 16)
            pending = []
            out[name].append((int(m.group(1), 16), m.group(2), m.group(3)))
    for k, ins in out.items():
        lab = labels[k]
        out[k] = [(a, o, re.sub(r"\.L_x_\d+", lambda x, lab=lab: hex(lab.get(x.group(0), 0)), r)) for a, o, r in ins]
    return {k: v for k, v in out.items() if v}


def loops(ins: list[tuple[int, str, str]], min_len: int = 40) -> list[tuple[int, int, Counter]]:
    spans = []
    for addr, op, rest in ins:
        m = re.search(r"0x([0-9a-f]+)", rest) if op.startswith("BRA") else None
        if m and int(m.group(1), 16) < addr and (addr - int(m.group(1), 16)) // 16 >= min_len:
            lo = int(m.group(1), 16)
            spans.append((lo, addr, Counter(o.split(".")[0] for a, o, _ in ins if lo <= a <= addr)))
    return spans


def main(path: str, pattern: str) -> None:
    for name, ins in kernels(open(path, errors="replace").read()).items():
        if not re.search(pattern, name):
            continue
        print(f"{name}: {len(ins)} instructions ({16 * len(ins)} bytes)")
        for lo, hi, kinds in loops(ins):
            top = ", ".join(f"{k} {n}" for k, n in kinds.most_common(8))
            print(f"  loop {lo:#07x}-{hi:#07x}: {sum(kinds.values())} instructions; HGMMA {kinds['HGMMA']}, "
                  f"BRA {kinds['BRA']}, FMUL {kinds['FMUL']}; {top}")


def compare(specs: list[str], top: int = 25) -> None:
    """Opcode counts of the loops named by LISTING:kernel-regex:0xLOOP, one column each, the opcodes where the
    first loop has the most over the second first."""
    columns = []
    for spec in specs:
        path, pattern, start = spec.rsplit(":", 2)
        found = [(name, kinds) for name, ins in kernels(open(path, errors="replace").read()).items()
                 if re.search(pattern, name) for lo, _, kinds in loops(ins) if lo == int(start, 16)]
        if len(found) != 1:
            sys.exit(f"{spec}: {len(found)} loops match (a kernel regex and a loop's first address, one loop)")
        columns.append((spec, found[0][1]))
    for i, (spec, kinds) in enumerate(columns):
        print(f"[{i}] {spec}: {sum(kinds.values())} instructions")
    second = columns[1][1] if len(columns) > 1 else Counter()
    ops = sorted({k for _, kinds in columns for k in kinds}, key=lambda k: (second[k] - columns[0][1][k], k))
    print(f"{'opcode':10s}" + "".join(f"{f'[{i}]':>8s}" for i in range(len(columns))))
    for k in ops[:top]:
        print(f"{k:10s}" + "".join(f"{kinds[k]:8d}" for _, kinds in columns))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--compare"]:
        compare(sys.argv[2:])
    else:
        main(sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "verify_sm90_kernel")
