"""Medians (us) of every row of kernel-sweep records side by side, one column per record, with each record's
order (interleaved / sequential): python3 ci/gpu/order_summary.py perf_history/kernel/order_<sha>/*.json"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(paths: list[str]) -> int:
    docs = [json.loads(Path(p).read_text()) for p in paths]
    print("columns: " + "  ".join(f"{Path(p).stem} ({d.get('order', 'sequential')})" for p, d in zip(paths, docs, strict=True)))
    print("cells: median us / share of the row's span under a power or thermal cap (NVML violation counters)")
    for p, d in zip(paths, docs, strict=True):
        ends = (d["fingerprint"].get("clocks") or {}, d.get("clocks_end") or {})
        print(f"{Path(p).stem}: clocks " + " -> ".join(f"{c.get('sm_mhz')} MHz {c.get('power_w')} W "
                                                      f"{c.get('throttle_reasons')}" for c in ends))
    for i, case in enumerate(docs[0]["cases"]):
        for label in case["results"]:
            cells = []
            for d in docs:
                row = d["cases"][i]["results"].get(label, {}) if i < len(d["cases"]) else {}
                frac = row.get("capped_frac")
                cap = f"/{100 * frac:3.0f}%" if frac is not None else "     "
                cells.append(f"{row['median_s'] * 1e6:8.1f}{cap}" if "median_s" in row else f"{'-':>13}")
            print(f"ctx{case['N']} T{case['T']} {label:36s}" + " ".join(cells))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
