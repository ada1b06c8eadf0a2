"""Markdown tables of a ci/gpu/sched_ab.py record (the A B B A rows at the sweep's K, the engine runs) and of the
timeline CSVs beside it (one row per replay: the last split's work against the median split, its rank among the
splits, the kernel's end and the last split's; then the sm90 prologue's marks per build and size, since each block's
entry where the build records it).

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

from kdengine.bench.timeline import (
    DURATION_KINDS,
    PROLOGUE,
    S_ISSUES,
    SPLIT_END,
    SPLIT_ENTRY,
    SPLIT_START,
    SPLIT_STEP1,
    SPLIT_TRIGGER,
)

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
    by = _records(path)
    start, trig, end = by[SPLIT_START], by[SPLIT_TRIGGER], by[SPLIT_END]
    t0 = min(start.values())
    out: dict[int, tuple[float, float]] = {}
    for blk in start:
        if blk in trig and blk in end:
            w, e = (trig[blk] - start[blk]) / 1e3, (end[blk] - t0) / 1e3
            old = out.get(blk // row_tiles, (0.0, 0.0))
            out[blk // row_tiles] = (max(old[0], w), max(old[1], e))
    return out


def _records(path: Path) -> dict[int, dict[int, int]]:
    """{kind: {block: t_ns}} of one replay's timeline CSV (.csv or .csv.gz)."""
    opener = gzip.open if path.suffix == ".gz" else open
    by: dict[int, dict[int, int]] = {}
    with opener(path, "rt") as fh:
        for r in csv.DictReader(fh):
            by.setdefault(int(r["kind"]), {})[int(r["block"])] = int(r["t_ns"])
    return by


# the prologue table's columns: the barrier passed (start), the marks in a block's order, step 1; then the tile loop's S
# issues (durations summed over the steps, not times since the origin)
PROLOGUE_COLUMNS = {SPLIT_START: "start", **{k: v for k, v in PROLOGUE.items() if k != SPLIT_ENTRY},
                    SPLIT_STEP1: "step 1", **{k: v.removeprefix("loop ") + " (sum)" for k, v in S_ISSUES.items()}}


def prologue(path: Path) -> tuple[str, dict[int, float]]:
    """(origin, {kind: the median over blocks of the mark's time in us after the block's origin}) of one replay: the
    origin is each block's entry mark where the build records it (so that a build issuing loads ahead of its first
    barrier compares with one that does not), else its start; a duration kind's figure is its median duration. Kinds no
    block recorded are left out."""
    by = _records(path)
    start, entry = by.get(SPLIT_START, {}), by.get(SPLIT_ENTRY, {})
    origin = {b: entry.get(b, t) for b, t in start.items()}
    out = {}
    for kind in PROLOGUE_COLUMNS:
        marks = [(t if kind in DURATION_KINDS else t - origin[b]) / 1e3 for b, t in by.get(kind, {}).items()
                 if b in origin]
        if marks:
            out[kind] = float(statistics.median(marks))
    return ("entry" if entry else "start"), out


def prologue_table(folder: Path) -> list[str]:
    """Per build (a folder of `folder`) and size: each prologue mark's median block over the replays (median of the
    replays' medians), in us since the block's entry (or its start, for records without entry marks)."""
    out = ["| prologue, us since | " + " | ".join(PROLOGUE_COLUMNS.values()) + " |",
           "|---|" + "---|" * len(PROLOGUE_COLUMNS)]
    for tag in sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name != "mma"):
        for size in sorted({p.name.rsplit("_", 1)[0] for p in (folder / tag).glob("timeline_*_T*")}):
            reps = [prologue(p) for p in sorted((folder / tag).glob(f"{size}_*"))]
            origins = {o for o, _ in reps}
            cells = []
            for kind in PROLOGUE_COLUMNS:
                vals = [m[kind] for _, m in reps if kind in m]
                cells.append(f"{statistics.median(vals):.2f}" if vals else "-")
            n, t = size.removeprefix("timeline_").split("_")
            out.append(f"| {tag} {SIZE.get(n, n)} {t}: {'/'.join(sorted(origins))} | " + " | ".join(cells) + " |")
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
    if len(sys.argv) not in (2, 3) or sys.argv[1] in ("-h", "--help"):
        print(__doc__)
        raise SystemExit(0 if sys.argv[1:2] in (["-h"], ["--help"]) else 2)
    lines = ab_table(json.loads(Path(sys.argv[1]).read_text()))
    if len(sys.argv) == 3:
        lines += [""] + timeline_table(Path(sys.argv[2])) + [""] + prologue_table(Path(sys.argv[2]))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
