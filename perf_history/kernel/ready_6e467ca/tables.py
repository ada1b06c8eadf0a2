"""The ready merge's tables from its two device runs' records: `python tables.py > tables.txt` (here).

Run 1 = 2a9d3ab (../ready_2a9d3ab/), run 2 = 6e467ca (this folder): ci/gpu/merge_ab.py --merges 7 8 (A B B A, medians
of 40 interleaved samples, at the sweep's K and at K = 1 call per replay), its decode engine runs (7 8 8 7), and the
in-kernel timeline's summary lines at 65k (timeline_c7.txt / timeline_c8.txt)."""

import csv
import gzip
import json
import statistics
from pathlib import Path

HERE = Path(__file__).resolve().parent
RUNS = (("2a9d3ab", HERE.parent / "ready_2a9d3ab"), ("6e467ca", HERE))


def label(size: str) -> str:
    n, t = size.split(":")
    return f"{ {'4096': '4k', '16384': '16k', '65536': '65k'}.get(n, n)} T{t}"


def main() -> None:
    for sha, folder in RUNS:
        d = json.loads((folder / f"merge_ab_ready_{sha}.json").read_text())
        print(f"## run {sha}: us, merge 7 / ready (8) / ready again / 7 again; 8 - 7 as the means of the pairs\n")
        print("| size | K | 7 | 8 | 8 again | 7 again | 8 - 7 |\n|---|---|---|---|---|---|---|")
        for size, rows in d["sizes"].items():
            forms = sorted({k.split("/")[0] for k in rows}, key=lambda f: f != "K1")[::-1]
            for form in forms:
                a, b, b2, a2 = (rows[f"{form}/{r}"]["median_us"] for r in ("c7", "c8", "c8/aa", "c7/aa"))
                print(f"| {label(size)} | {form[1:]} | {a:.2f} | {b:.2f} | {b2:.2f} | {a2:.2f} | {(b + b2 - a - a2) / 2:+.2f} |")
        print("\ndecode engine (8 layers, CUDA graphs), tok/s in run order:")
        ctxs = sorted({k.split("/")[0] for k in d["decode"]}, key=lambda c: -int(c.removeprefix("decode")))
        for ctx in ctxs:
            runs = [(k.split("/")[2], v) for k, v in d["decode"].items() if k.startswith(ctx + "/")]
            line = ", ".join(f"{m} {v['tok_per_s']:.1f} (verify {v['phase_ms'].get('verify-attention', float('nan')):.3f} ms)"
                             for m, v in runs)
            print(f"- {ctx}: {line}")
        print("\ntimeline at 65k (medians over 3 replays):")
        for c in (7, 8):
            for line in (folder / f"timeline_c{c}.txt").read_text().splitlines():
                if line.startswith("ctx") or any(w in line for w in ("release", "merge work", "last split end ->")):
                    print("    " + line.strip())
        print()
    print("## per merge block, run 6e467ca's raw timelines (raw/, replay 1 of 3), us after the last split block's end mark")
    print("(merge_start: block on its SM; merge_waited: griddepcontrol.wait returned (7) / warp 0's first flags seen (8))\n")
    print("| size | merge | last split end (since the first split start) | start p50 / max | waited min / p50 / max | "
          "end p50 / max | end - waited p50 |")
    print("|---|---|---|---|---|---|---|")
    for T in (16, 64):
        for c in (7, 8):
            print(block_row(HERE / "raw" / f"timeline_65536_T{T}_c{c}_1.csv.gz", T, c))


def block_row(path: Path, T: int, c: int) -> str:
    kinds = {0: "split_start", 2: "split_end", 3: "merge_start", 4: "merge_waited", 5: "merge_end"}
    t = {k: {} for k in kinds.values()}
    with gzip.open(path, "rt") as f:
        for r in csv.DictReader(f):
            if int(r["kind"]) in kinds:
                t[kinds[int(r["kind"])]][int(r["block"])] = int(r["t_ns"])
    last = max(t["split_end"].values())
    rel = {k: sorted((v - last) / 1000 for v in t[k].values()) for k in ("merge_start", "merge_waited", "merge_end")}
    per = [(t["merge_end"][b] - t["merge_waited"][b]) / 1000 for b in t["merge_end"] if b in t["merge_waited"]]
    med = statistics.median
    first = min(t["split_start"].values())
    return (f"| 65k T{T} | {c} | {(last - first) / 1000:.2f} | {med(rel['merge_start']):+.2f} / {rel['merge_start'][-1]:+.2f} | "
            f"{rel['merge_waited'][0]:+.2f} / {med(rel['merge_waited']):+.2f} / {rel['merge_waited'][-1]:+.2f} | "
            f"{med(rel['merge_end']):+.2f} / {rel['merge_end'][-1]:+.2f} | {med(per):.2f} |")


if __name__ == "__main__":
    main()
