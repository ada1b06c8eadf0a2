"""Re-judge the recorded H200 planted-slowdown run (perf_history/gate/planted_5563d64d9e_rule_717e5a8.json: a planted
3-7% cuda slowdown, confirmed from its recorded interleaved rounds, as rejudge_438b905.py does) with intended trades
(ci/accept.py) naming its rows: one row under a bound below its confirmed change, the same row under a bound above
it, then every cuda row under a bound above its change. Run from the repository root."""
import json
import sys

sys.path.insert(0, ".")
from ci import gate  # noqa: E402

config = gate.load_thresholds()
d = json.load(open("perf_history/gate/planted_5563d64d9e_rule_717e5a8.json"))


def rejudge(accepted):
    rows = []
    for b in d["benchmarks"]:
        c = b.get("confirmation")
        if isinstance(c, dict) and c.get("base") and c.get("head"):
            rows.append(gate.confirm(dict(b, verdict=c["first_pass"], confirmation=None), c["base"], c["head"], config))
        else:
            rows.append(dict(b))
    machines = [{"machine": "gpu-nvidia-h200-sm90", "benchmarks": rows, "notes": []}]
    return gate.summarize(d.get("base"), d.get("head"), machines, accepted)


def trade(name, bound):
    return {"commit": "0" * 40, "name": name, "bound": bound, "reason": "re-judged with a trade"}


cuda = sorted(b["name"] for b in d["benchmarks"] if b["name"].startswith("verify/cuda/"))
for label, acc in (("no trade", []), ("65k T64 up to 2%", [trade("verify/cuda/ctx65536/T64", 0.02)]),
                   ("65k T64 up to 5%", [trade("verify/cuda/ctx65536/T64", 0.05)]),
                   ("every cuda row up to 8%", [trade(n, 0.08) for n in cuda])):
    res = rejudge(acc)
    v = {b["name"].removeprefix("verify/"): b["verdict"] for b in res["benchmarks"] if b["name"] in cuda}
    print(f"{label}: exit {res['exit_code']}; " + ", ".join(f"{k} {x}" for k, x in v.items()))
