"""The hottest lines of an ncu source page (`ncu --import R --page source --csv --print-source sass|cuda`):
the N lines with the most warp-stall samples, each with its share of all samples and its largest stall
columns, then the stall columns summed over the kernel.

    python ci/gpu/ncu_source_top.py REPORT.csv [N]
"""

from __future__ import annotations

import csv
import sys


def number(text: str) -> float:
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return 0.0


def read_rows(path: str) -> tuple[list[str], list[dict]]:
    with open(path, newline="", errors="replace") as f:
        lines = [ln for ln in f if not ln.startswith("==")]
    start = next(i for i, ln in enumerate(lines) if "Source" in ln and "," in ln)
    reader = csv.DictReader(lines[start:])
    return list(reader.fieldnames or []), list(reader)


def main(path: str, n: int) -> None:
    fields, rows = read_rows(path)
    samples = next((f for f in fields if "Warp Stall Sampling (All" in f), None)
    if samples is None:
        print(f"{path}: no warp-stall samples in this view ({len(rows)} lines)")
        return
    stalls = [f for f in fields if f.startswith("stall_") and "Not Issued" not in f]
    total = sum(number(r[samples]) for r in rows) or 1.0
    print(f"{path}: {len(rows)} lines, {total:.0f} samples ({samples})")
    for r in sorted(rows, key=lambda r: -number(r[samples]))[:n]:
        top = sorted(((number(r[s]), s) for s in stalls), reverse=True)[:3]
        why = " ".join(f"{s}={v:.0f}" for v, s in top if v > 0)
        where = r.get("# Address") or r.get("Address") or r.get("# Line") or r.get("Line") or ""
        print(f"{100 * number(r[samples]) / total:5.1f}% {where:>8} {r['Source'].strip()[:90]:90s} {why}")
    sums = sorted(((sum(number(r[s]) for r in rows), s) for s in stalls), reverse=True)
    print("stall columns over the kernel: " + ", ".join(f"{s} {100 * v / total:.1f}%" for v, s in sums[:12] if v > 0))
    by_op: dict[str, float] = {}
    executed: dict[str, float] = {}
    for r in rows:  # samples and executed warp instructions per opcode (HMMA, LDS, FADD, ...), predicates dropped
        words = [w for w in r["Source"].split() if not w.startswith("@")]
        op = words[0].split(".")[0] if words else "?"
        by_op[op] = by_op.get(op, 0.0) + number(r[samples])
        executed[op] = executed.get(op, 0.0) + number(r.get("Instructions Executed", "0"))
    print("samples by opcode: " + ", ".join(f"{op} {100 * v / total:.1f}%"
                                             for op, v in sorted(by_op.items(), key=lambda kv: -kv[1])[:14]))
    hmma = executed.get("HMMA", 0.0) or 1.0
    print(f"executed warp instructions {sum(executed.values()):.4g}, per HMMA {sum(executed.values()) / hmma:.2f}; "
          "by opcode per HMMA: " + ", ".join(f"{op} {v / hmma:.3f}"
                                              for op, v in sorted(executed.items(), key=lambda kv: -kv[1])[:22]))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 30)
