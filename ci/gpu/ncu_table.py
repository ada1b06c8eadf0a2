"""The table of ci/gpu/ncu_paths.sh's CSVs (ncu --csv --metrics, one launch each): a row per kernel and size with its
duration, tensor pipe active %, issue slots %, warps active per SM, DRAM %, and stalls per issued instruction by reason.

    PYTHONPATH=. python3 ci/gpu/ncu_table.py DIR      (DIR holds {sm90,mma,flashmla}_T{16,64}.csv)
"""

from __future__ import annotations

import sys
from pathlib import Path

from ci.gpu.ncu_metrics import csv_rows

KERNELS = (("sm90", "sm90 default (dispatched)"), ("mma", "mma.sync default"), ("flashmla", "FlashMLA"))
COLUMNS = (("gpu__time_duration.sum", "us", 1), ("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
           "tensor %", 1), ("sm__inst_issued.avg.pct_of_peak_sustained_active", "issue %", 1),
           ("sm__warps_active.avg.per_cycle_active", "warps/SM", 1),
           ("gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed", "DRAM %", 1))
STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")
TO_US = {"ns": 1e-3, "us": 1.0, "ms": 1e3, "nsecond": 1e-3, "usecond": 1.0, "msecond": 1e3}  # ncu spells both
SKIP = ("selected",)  # "selected": the issuing cycle itself, 1.00 by definition


def read(path: Path) -> dict[str, float]:
    """{metric: value} of the report's first launch (ncu's own lines, not CSV rows, skipped)."""
    rows = csv_rows(path.read_text().splitlines())
    if len(rows) < 2:
        return {}
    head = rows[0]
    k, m, v, unit = (head.index(c) for c in ("ID", "Metric Name", "Metric Value", "Metric Unit"))
    first = rows[1][k]
    out = {}
    for r in rows[1:]:
        if r[k] != first:
            continue
        value = float(r[v].replace(",", ""))
        out[r[m]] = value * TO_US.get(r[unit], 1) if r[m] == "gpu__time_duration.sum" else value
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print(__doc__, file=sys.stderr)
        return 2
    folder = Path(argv[0])
    got = {(name, T): read(folder / f"{name}_T{T}.csv") for name, _ in KERNELS for T in (16, 64)
           if (folder / f"{name}_T{T}.csv").exists()}
    reasons = sorted({m[len(STALL[0]):-len(STALL[1])] for d in got.values() for m in d if m.startswith(STALL[0])}
                     - set(SKIP),
                     key=lambda r: -max(d.get(STALL[0] + r + STALL[1], 0) for d in got.values()))
    print("| 65k | kernel | " + " | ".join(c[1] for c in COLUMNS) + " | stalls per issue (" + ", ".join(reasons) + ") |")
    print("|---|---|" + "---|" * len(COLUMNS) + "---|")
    for (name, T), d in got.items():
        label = dict(KERNELS)[name]
        if not d:
            print(f"| T={T} | {label} | " + " | ".join("-" for _ in COLUMNS) + " | no report |")
            continue
        cols = " | ".join(f"{d[m] * s:.2f}" if m in d else "-" for m, _, s in COLUMNS)
        stalls = ", ".join(f"{d.get(STALL[0] + r + STALL[1], float('nan')):.2f}" for r in reasons)
        print(f"| T={T} | {label} | {cols} | {stalls} |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
