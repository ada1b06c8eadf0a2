"""Markdown tables of a ci/gpu/sched_ab.py record (the A B B A rows at the sweep's K, the engine runs) and of the
timeline CSVs beside it (one row per replay: the last split's work against the median split, its rank among the
splits, the kernel's end and the last split's).

    python3 ci/gpu/sched_ab_tables.py RECORD.json [TIMELINE_DIR]

Each engine context's line ends with B against A (the B runs' mean tok/s against the A runs') beside the spread of
one engine run there, from the engine A/A records (ENGINE_AA: sched_ab.py --decode-order AAAAAAAA): one A B B A set's
difference has about that sd, so a change under twice it is not resolved.
"""

from __future__ import annotations

import csv
import gzip
import json
import statistics
import sys
from pathlib import Path

from kdengine.bench.timeline import SPLIT_END, SPLIT_START, SPLIT_TRIGGER

SIZE = {"4096": "4k", "16384": "16k", "65536": "65k"}
ENGINE_AA = Path(__file__).resolve().parents[2] / "perf_history" / "kernel" / "engine_aa_d5d753d"


def engine_sd(folder: Path = ENGINE_AA) -> dict[str, float]:
    """{context: the sd of one engine run's tok/s in % of its set's mean}, pooled over the A/A records' sets (each
    record's runs at one context form a set); {} without records."""
    dev: dict[str, list[float]] = {}
    for path in sorted(folder.glob("aa_engine_*.json")):
        by: dict[str, list[float]] = {}
        for label, v in json.loads(path.read_text()).get("decode", {}).items():
            by.setdefault(label.split("/")[0].removeprefix("decode"), []).append(v["tok_per_s"])
        for ctx, xs in by.items():
            if len(xs) > 1:
                mean = statistics.fmean(xs)
                dev.setdefault(ctx, []).extend(100 * (x / mean - 1) for x in xs)
    return {ctx: statistics.stdev(d) for ctx, d in dev.items() if len(d) > 2}


def engine_line(ctx: str, runs: dict[str, dict], sd: dict[str, float]) -> str:
    """One context's engine runs, then B against A and the resolution there."""
    text = f"- decode {ctx}: " + ", ".join(f"{x.split('/', 1)[1]} {v['tok_per_s']:.1f} tok/s" for x, v in runs.items())
    a = [v["tok_per_s"] for x, v in runs.items() if x.split("/")[1].endswith("=0")]
    b = [v["tok_per_s"] for x, v in runs.items() if x.split("/")[1].endswith("=1")]
    if a and b:
        text += f"; B against A {100 * (statistics.fmean(b) / statistics.fmean(a) - 1):+.2f}%"
        if ctx in sd:
            text += f" (one run's A/A sd here {sd[ctx]:.2f}%: {ENGINE_AA.name})"
    return text


def ab_table(doc: dict) -> list[str]:
    base, probe = doc["rows"][:2]
    out = ["| size | A | B | B again | A again | B - A (us) |", "|---|---|---|---|---|---|"]
    for size, v in doc["sizes"].items():
        k = next(x.split("/")[0] for x in v if x.startswith("K") and not x.startswith("K1/"))
        a = [v[f"{k}/{base}"]["median_us"], v[f"{k}/{base}/aa1"]["median_us"]]
        b = [v[f"{k}/{probe}"]["median_us"], v[f"{k}/{probe}/aa1"]["median_us"]]
        n, t = size.split(":")
        out.append(f"| {SIZE.get(n, n)} T{t} ({k}) | {a[0]:.2f} | {b[0]:.2f} | {b[1]:.2f} | {a[1]:.2f} | "
                   f"{min(b) - max(a):+.2f} to {max(b) - min(a):+.2f} |")
    sd = engine_sd()
    for ctx in ("65536", "16384", "4096"):
        runs = {x: v for x, v in doc.get("decode", {}).items() if x.startswith(f"decode{ctx}/")}
        if runs:
            out.append(engine_line(ctx, runs, sd))
    return out


def splits(path: Path, row_tiles: int) -> dict[int, tuple[float, float]]:
    """{split: (work us = start -> trigger, end us from the first block's start)}, the slowest block of each split."""
    opener = gzip.open if path.suffix == ".gz" else open
    by: dict[int, dict[int, int]] = {}
    with opener(path, "rt") as fh:
        for r in csv.DictReader(fh):
            by.setdefault(int(r["kind"]), {})[int(r["block"])] = int(r["t_ns"])
    start, trig, end = by[SPLIT_START], by[SPLIT_TRIGGER], by[SPLIT_END]
    t0 = min(start.values())
    out: dict[int, tuple[float, float]] = {}
    for blk in start:
        if blk in trig and blk in end:
            w, e = (trig[blk] - start[blk]) / 1e3, (end[blk] - t0) / 1e3
            old = out.get(blk // row_tiles, (0.0, 0.0))
            out[blk // row_tiles] = (max(old[0], w), max(old[1], e))
    return out


def timeline_table(folder: Path) -> list[str]:
    out = ["| timeline | replay | last split work (us) | median split | rank of the last split | kernel end | "
           "last split end |", "|---|---|---|---|---|---|---|"]
    for tag in sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name != "mma"):
        for path in sorted((folder / tag).glob("timeline_65536_T*")):
            t = "T16" if "_T16_" in path.name else "T64"
            sp = splits(path, 2 if t == "T16" else 8)  # 64-row tiles of T x 8 heads
            last = max(sp)
            ranked = sorted(sp, key=lambda s: sp[s][0], reverse=True)
            replay = path.name.split(".")[0].rsplit("_", 1)[1]
            out.append(f"| {tag} 65k {t} | {replay} | {sp[last][0]:.2f} | "
                       f"{statistics.median(w for w, _ in sp.values()):.2f} | {ranked.index(last) + 1} of {len(sp)} | "
                       f"{max(e for _, e in sp.values()):.2f} | {sp[last][1]:.2f} |")
    return out


def main() -> None:
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    lines = ab_table(json.loads(Path(sys.argv[1]).read_text()))
    if len(sys.argv) == 3:
        lines += [""] + timeline_table(Path(sys.argv[2]))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
