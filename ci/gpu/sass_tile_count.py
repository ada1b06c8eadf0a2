"""Static SASS instructions of one steady-state tile of a split kernel's main loop (nvdisasm -c output): the
loop is the one whose back edge jumps over a half barrier (BAR.SYNC 0x1); the walk takes every forward branch
except one that would skip the KV copy (LDGSTS), i.e. more tiles follow, no row max moved, no masked tail.
Counts per warp per tile, and per HMMA. A static estimate (ncu's executed count is the measurement).

    nvcc ... -cubin csrc/verify_kernel.cu -o k.cubin && nvdisasm -c k.cubin > k.sass
    python ci/gpu/sass_tile_count.py k.sass verify_split_kernel_lean
"""

from __future__ import annotations

import collections
import re
import sys


def parse(text: str, kernel: str) -> list[tuple[str, str]]:
    """The (kind, text) lines of the first function whose name contains `kernel`: labels and instructions."""
    body = next(f for f in re.split(r"//-+ \.text\.", text)[1:] if kernel in f.split()[0])
    lines = []
    for line in body.splitlines():
        label = re.match(r"^(\.L_x_\d+):", line.strip())
        if label:
            lines.append(("L", label.group(1)))
            continue
        ins = re.search(r"/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if ins:
            lines.append(("I", ins.group(2).strip()))
    return lines


def count_tile(lines: list[tuple[str, str]]) -> collections.Counter:
    at = {v: i for i, (k, v) in enumerate(lines) if k == "L"}
    branch = re.compile(r"BRA(?:\.U)?\s+(?:!?U?P\d,\s*)?`\((\.L_x_\d+)\)")
    head = back = None
    for i, (k, v) in enumerate(lines):
        m = branch.search(v) if k == "I" else None
        if m and at[m.group(1)] < i and any("BAR.SYNC.DEFER_BLOCKING 0x1" in x[1] for x in lines[at[m.group(1)]:i]):
            head, back = m.group(1), i
    ops: collections.Counter = collections.Counter()
    i = at[head] + 1
    while i <= back:
        k, v = lines[i]
        if k == "I":
            ops[re.sub(r"^@!?U?P\w+\s+", "", v).split()[0].split(".")[0]] += 1
            m = branch.search(v)
            if i < back and m and at[m.group(1)] > i:
                target = at[m.group(1)]
                if not any("LDGSTS" in x[1] for x in lines[i:target]):
                    i = target + 1
                    continue
        i += 1
    return ops


def main(path: str, kernel: str) -> None:
    ops = count_tile(parse(open(path).read(), kernel))
    total = sum(ops.values())
    print(f"{total} instructions per tile per warp, {ops['HMMA']} HMMA, {total / max(ops['HMMA'], 1):.2f} per HMMA;",
          " ".join(f"{k}={c}" for k, c in ops.most_common(16)))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
