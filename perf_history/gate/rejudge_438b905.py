"""Re-judge the recorded H200 gate runs (perf_history/gate/*.json) with the current decision code: every row
that went through confirmation is confirmed again from its recorded interleaved rounds (gate.confirm, its
first-pass verdict and floor as recorded), then the run is summarized (gate.summarize: exit 0 / 1 / 3)."""
import glob, json, sys
sys.path.insert(0, ".")
from ci import gate

config = gate.load_thresholds()
for path in sorted(glob.glob("perf_history/gate/*.json")):
    d = json.load(open(path))
    rows = []
    for b in d["benchmarks"]:
        c = b.get("confirmation")
        if isinstance(c, dict) and c.get("base") and c.get("head"):
            row = dict(b, verdict=c["first_pass"], confirmation=None)
            rows.append(gate.confirm(row, c["base"], c["head"], config))
        else:
            rows.append(b)
    res = gate.summarize(d.get("base"), d.get("head"), [{"machine": "gpu-nvidia-h200-sm90", "benchmarks": rows, "notes": []}])
    conf = [r for r in rows if r.get("confirmation")]
    print(f"{path.split('/')[-1]}: recorded exit {d['exit_code']} -> now exit {res['exit_code']}; "
          f"regressed {len(res['regressed'])}, unsettled {res['unsettled']}; confirmed rows: "
          + ", ".join(f"{r['name'].removeprefix('verify/')} {r['verdict']} ({r['confirmation']['worse']:+.1%})" for r in conf))
