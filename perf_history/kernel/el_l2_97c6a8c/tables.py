"""The tables of this folder's README, from its four JSONs (run from the repository root):
python perf_history/kernel/el_l2_97c6a8c/tables.py > perf_history/kernel/el_l2_97c6a8c/tables.txt
A = seesaw2, B = seesaw2_el, T * H = 128 query rows (two row tiles): T = 16 at H = 8, T = 8 at H = 16."""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
KIND = {"cuda_sm90_seesaw2": "A", "cuda_sm90_seesaw2_el": "B"}


def labels(rows: list[str]) -> list[str]:  # sched_ab.py's row labels
    return [r if rows[:i].count(r) == 0 else f"{r}/aa{rows[:i].count(r)}" for i, r in enumerate(rows)]


def span(xs: list[float], digits: int = 2) -> str:
    return f"{statistics.mean(xs):7.{digits}f} [{min(xs):.{digits}f}, {max(xs):.{digits}f}]"


def sweep(name: str) -> None:
    doc = json.loads((HERE / name).read_text())
    rows, labs = doc["rows"], labels(doc["rows"])
    order = "".join(KIND[r] for r in rows)
    print(f"## {name} (rows {order}, H = {doc.get('heads', 8)}; commit in its fingerprint "
          f"{doc['fingerprint']['commit'][:7]})")
    print("size       K    A mean [min, max]         B mean [min, max]         B - A (means)")
    for size, got in doc["sizes"].items():
        ks = sorted({k.split("/")[0] for k in got if k.startswith("K")}, key=lambda k: int(k[1:]))
        for k in ks:
            us = {lab: got[f"{k}/{lab}"]["median_us"] for lab in labs}
            a = [us[lab] for lab, r in zip(labs, rows, strict=True) if KIND[r] == "A"]
            b = [us[lab] for lab, r in zip(labs, rows, strict=True) if KIND[r] == "B"]
            disjoint = " (disjoint)" if max(b) < min(a) or min(b) > max(a) else ""
            print(f"{size:10s} {k:4s} {span(a)}   {span(b)}   {statistics.mean(b) - statistics.mean(a):+.2f}{disjoint}")
            if k == "K1":  # one call a sample: each row's predecessor is the row before it (the last row's, the first)
                by = {}
                for kind in "AB":
                    same = [us[labs[i]] for i, r in enumerate(rows) if KIND[r] == kind and KIND[rows[i - 1]] == kind]
                    other = [us[labs[i]] for i, r in enumerate(rows) if KIND[r] == kind and KIND[rows[i - 1]] != kind]
                    by[kind] = statistics.mean(same), statistics.mean(other)
                    print(f"{'':15s}{kind} after its own kind {span(same)}   after the other {span(other)}")
                (a_same, a_other), (b_same, b_other) = by["A"], by["B"]
                print(f"{'':15s}B - A after its own kind {b_same - a_same:+.2f}, after the other {b_other - a_other:+.2f};"
                      f" the switch costs A {a_other - a_same:.2f}, B {b_other - b_same:.2f}")
    print()


def engine(name: str) -> None:
    doc = json.loads((HERE / name).read_text())
    print(f"## {name} (decode engine, 8 layers, T = {doc['budget'] + 1}, order {doc['order']}; "
          f"commit {doc['fingerprint']['commit'][:7]})")
    print("ctx      A tok/s mean [min, max]        B tok/s                      B - A      "
          "verify-attention ms / step: A, B")
    ctxs = dict.fromkeys(k.split("/")[0] for k in doc["decode"])
    for ctx in ctxs:
        runs = {s: [v for k, v in doc["decode"].items() if k.startswith(f"{ctx}/{s}/")] for s in ("seesaw2", "seesaw2_el")}
        tok = {s: [r["tok_per_s"] for r in rs] for s, rs in runs.items()}
        att = {s: [r["phase_ms"]["verify-attention"] for r in rs] for s, rs in runs.items()}
        da = statistics.mean(tok["seesaw2_el"]) / statistics.mean(tok["seesaw2"]) - 1
        print(f"{ctx:14s} {span(tok['seesaw2'])}   {span(tok['seesaw2_el'])}   {100 * da:+.2f}%   "
              f"{span(att['seesaw2'], 3)}, {span(att['seesaw2_el'], 3)}")
    print()


sweep("el_l2_ab8_7e4681e.json")
sweep("el_k1_order_97c6a8c.json")
sweep("el_h16_83e0214.json")
engine("el_engine_97c6a8c.json")
