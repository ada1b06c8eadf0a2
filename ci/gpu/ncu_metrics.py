"""The rows of an `ncu --csv --metrics ...` report, one line per launch and metric (ncu's own lines skipped).

    python3 ci/gpu/ncu_metrics.py FILE|-             kernel name (60 chars), metric, value
    python3 ci/gpu/ncu_metrics.py FILE|- --stalls    metric (stall ratios as stall_<reason>), value
"""
import csv
import sys


def csv_rows(lines) -> list[list[str]]:
    """The CSV rows of an `ncu --csv` report, its header first (ncu's own lines, which are not CSV rows, skipped)."""
    return list(csv.reader(line for line in lines if line.startswith('"')))


def main(argv: list[str]) -> None:
    src = sys.stdin if argv[0] == "-" else open(argv[0])
    rows = csv_rows(src)
    head, rows = rows[0], rows[1:]
    k, m, v = head.index("Kernel Name"), head.index("Metric Name"), head.index("Metric Value")
    for r in rows:
        if "--stalls" in argv:
            name = r[m].replace("smsp__average_warps_issue_stalled_", "stall_").replace("_per_issue_active.ratio", "")
            print(f"  {name:60s} {r[v]}")
        else:
            print(f"{r[k][:60]:60s} {r[m]:45s} {r[v]}")


if __name__ == "__main__":
    main(sys.argv[1:])
