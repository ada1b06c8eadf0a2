"""The tables of README.md here, from the record's JSON and the ncu reports in this folder (nothing typed by hand).

    python perf_history/kernel/mma6_0c41cd6/tables.py
"""

import gzip
import json
import re
from pathlib import Path

HERE = Path(__file__).parent
d = json.loads((HERE.parent / "verify_kernel_mma6_gpu-nvidia-h200-sm90_0c41cd6.json").read_text())
base = d["default_label"]
cols = [("8 (default then)", base), ("8 again (A/A)", base + "/aa")]
for lab, name in (("12 qs", "qs"), ("13 qs2", "qs2"), ("14 up", "up"), ("15 qsup", "qsup")):
    cols.append((lab, base.replace("pp2leanv5/", f"pp2lean{name}/")))
size = {4096: "4k", 16384: "16k", 65536: "65k"}
print("| size | " + " | ".join(c[0] for c in cols) + " | A/A spread | 12 against the faster of 8 / A/A |")
print("|" + "---|" * (len(cols) + 3))
for c in d["cases"]:
    r = c["results"]
    us = [r[k]["median_s"] * 1e6 for _, k in cols]
    fast = min(us[0], us[1])
    print(f"| {size[c['N']]} T={c['T']} | " + " | ".join(f"{u:.1f}" for u in us)
          + f" | {abs(us[0] - us[1]) / fast * 100:.2f}% | {(us[2] - fast) / fast * 100:+.1f}% |")
print()
print("| 65k, samples' quartiles (us) | " + " | ".join(c[0] for c in cols[:3]) + " |")
print("|---|---|---|---|")
for c in d["cases"]:
    if c["N"] == 65536:
        q = []
        for _, k in cols[:3]:
            s = sorted(c["results"][k]["samples"])
            q.append(f"{s[len(s) // 4] * 1e6:.2f} - {s[3 * len(s) // 4] * 1e6:.2f}")
        print(f"| T={c['T']} | " + " | ".join(q) + " |")
print()
print("| pingpong | T | duration us | tensor pipe % | issue active % | warp instructions | stalls per issue: wait | "
      "short_sb | long_sb | barrier | lg_throttle |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for lab, f in (("8 (before)", "ncu_cw16_pp8_T16"), ("12 (after)", "ncu_cw16_pp12_T16"), ("8 (before)", "ncu_cw16_pp8_T64")):
    dur = re.search(r"Duration\s+us\s+([\d.,]+)", (HERE / f"{f}.txt").read_text()).group(1)
    raw = gzip.open(HERE / f"{f}.raw.txt.gz", "rt").read()

    def metric(name):
        m = re.search(re.escape(name) + r"\s+\S+\s+([\d.,]+)", raw)
        return m.group(1) if m else "-"

    vals = [metric("sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active"),
            metric("smsp__issue_active.avg.pct_of_peak_sustained_active"), metric("smsp__inst_executed.sum")]
    vals += [metric(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio")
             for s in ("wait", "short_scoreboard", "long_scoreboard", "barrier", "lg_throttle")]
    print(f"| {lab} | {f.split('_T')[1]} | {dur} | " + " | ".join(vals) + " |")
