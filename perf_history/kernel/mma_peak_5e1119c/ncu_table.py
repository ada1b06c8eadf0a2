"""ncu's tensor (hmma) pipe of each mma_peak line (mma_peak_ncu.txt: every launch of `mma_peak 1024` under ncu), beside
its rate in the timed run (mma_peak.txt, 4096 iterations, no profiler): `python ncu_table.py > ncu_table.txt`.
A line's launches are the warm-up and 5 timed ones; the table gives the median of their hmma cycles active %, hmma
instructions executed % and issue-slot %."""

import re
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
LINE = re.compile(r"^\s+(\d+)\s+(\d+)\s+(\d+)\s+([\d.]+)\s+([\d.]+)\s+([\d.]+)$")
HEAD = re.compile(r"mma_loop<(\d+), (\d+)>\(float \*, int\) \((\d+), 1, 1\)x\((\d+), 1, 1\)")
METRICS = {"sm__pipe_tensor_op_hmma_cycles_active": "hmma cycles %", "sm__inst_executed_pipe_tensor_op_hmma": "hmma inst %",
           "smsp__issue_active": "issue %"}


def main() -> None:
    timed = {}
    for line in (HERE / "mma_peak.txt").read_text().splitlines():
        m = LINE.match(line)
        if m:
            warps, chains, feed = (int(x) for x in m.groups()[:3])
            timed[(warps, chains, feed)] = float(m.group(4))
    sms = int(re.search(r"(\d+) SMs", (HERE / "mma_peak.txt").read_text()).group(1))
    seen: dict[tuple, dict[str, list[float]]] = {}
    key = None
    for line in (HERE / "mma_peak_ncu.txt").read_text().splitlines():
        h = HEAD.search(line)
        if h:
            chains, feed, grid, block = (int(x) for x in h.groups())
            key = (grid // sms * block // 32, chains, feed)
            seen.setdefault(key, {v: [] for v in METRICS.values()})
            continue
        for metric, name in METRICS.items():
            if key and line.strip().startswith(metric):
                seen[key][name].append(float(line.split()[-1]))
    print("| warps/SM | chains | feed | TF/s (timed) | " + " | ".join(METRICS.values()) + " |")
    print("|---|---|---|---|" + "---|" * len(METRICS))
    for k in sorted(seen):
        cells = " | ".join(f"{statistics.median(v):.1f}" if v else "-" for v in seen[k].values())
        print(f"| {k[0]} | {k[1]} | {k[2]} | {timed.get(k, float('nan')):.1f} | {cells} |")


if __name__ == "__main__":
    main()
