"""Re-judge stored H200 gate runs with this checkout's decision code: every row that had confirmation rounds is
confirmed again from its stored interleaved round medians (real GPU runs), the trades of the measured commit (git, its
Perf-Accepted trailers) applied, and the verdicts, exit code and trade notes printed.

    python replay.py                                  the four runs of perf_history/gate/gpu_accept_4617adb/
    python replay.py DIR RUN.json[:COMMIT] ...        other runs (COMMIT: the plant whose trailers apply)"""
import copy, json, sys, tomllib
from ci import accept, gate

config = tomllib.loads(open("ci/thresholds.toml").read())
DIR = "perf_history/gate/gpu_accept_4617adb/"
RUNS = [("run1_d8a47510c2.json", None), ("call2/run0_f05750e7c2.json", None),
        ("run2_ba18f109b4.json", "ba18f10"), ("call2/run1_d6a41910a8.json", "d6a4191")]
if len(sys.argv) > 2:
    DIR = sys.argv[1].rstrip("/") + "/"
    RUNS = [(arg.partition(":")[0], arg.partition(":")[2] or None) for arg in sys.argv[2:]]
for path, commit in RUNS:
    doc = json.load(open(DIR + path))
    rows = []
    for b in copy.deepcopy(doc["benchmarks"]):
        c = b.get("confirmation")
        if c:
            b["verdict"] = c["first_pass"]
            b.pop("acceptance", None)
            gate.confirm(b, c["base"], c["head"], config)
        rows.append(b)
    acc = []
    if commit:
        acc, _ = accept.read(".", commit + "^", commit)
        acc = [a._asdict() if hasattr(a, "_asdict") else dict(vars(a)) if not isinstance(a, dict) else a for a in acc]
    out = gate.summarize(doc["base"], doc["head"], [{"machine": "h200", "notes": [], "benchmarks": rows}], acc)
    stored = {b["name"]: b["verdict"] for b in doc["benchmarks"]}
    print(f"{path}: exit {out['exit_code']} (stored {doc['exit_code']})")
    for b in out["benchmarks"]:
        same = "same" if stored[b["name"]] == b["verdict"] else f"STORED {stored[b['name']]}"
        print(f"  {b['name']:28s} {b['verdict']:10s} {b.get('worse') or 0:+.2%}  {same}")
    for n in out.get("accept_notes", []):
        print("  note:", n)
