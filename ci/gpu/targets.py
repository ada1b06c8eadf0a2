"""The verify kernel's targets (issue 12) against the committed H200 records, as a markdown table: every figure read
from perf_history/kernel/*.json (the latest commit's `peers` runs, `merge` runs and `nsplit2` records), none typed.

    python ci/gpu/targets.py                 # print the table
    python ci/gpu/targets.py --write README.md   # replace the block between the README's targets markers
    python ci/gpu/targets.py --check README.md   # exit 1 when that block is not what the records give

The latest commit's `peers` runs all count (ci/gpu/peers_runs.sh times several): each figure is the median over them,
a ratio the median of the runs' ratios, with the runs' range beside it. Rows: the sm90 path (the dispatched call
`cuda`, which runs the sm90 kernel on Hopper) against the absolute targets and FlashMLA measured in the same run; the
mma.sync default (the record's default_label) against its own; the merge's in-graph share (the `merge` runs); auto
NSPLIT against the best fixed count on both paths (`nsplit2`). A target the records cannot show (sm_120, ncu) is not
a row: the README's prose and the issue note carry those."""

from __future__ import annotations

import argparse
import glob
import json
import statistics
import sys
from pathlib import Path

from kdengine.bench import kernel

ROOT = Path(__file__).resolve().parents[2]
KERNEL = ROOT / "perf_history" / "kernel"
BEGIN, END = "<!-- targets:begin (ci/gpu/targets.py) -->", "<!-- targets:end -->"
DISPATCH, PEER, TORCH = "cuda", "flashmla", "torch"
SIZES = ((4096, 16), (4096, 64), (16384, 16), (16384, 64), (65536, 16), (65536, 64))


def latest(pattern: str, set_name: str) -> list[dict]:
    """The records of `set_name` under KERNEL matching `pattern` measured on sm_90 (the targets are the H200's), the
    latest date's commit only (all its passes)."""
    docs = [json.loads(Path(p).read_text()) for p in sorted(glob.glob(str(KERNEL / pattern)))]
    docs = [d for d in docs if d.get("set") == set_name and d["fingerprint"].get("capability") == "sm_90"]
    if not docs:
        return []
    newest = max(docs, key=lambda d: d["date"])
    commit = newest["fingerprint"].get("commit")
    return sorted((d for d in docs if d["fingerprint"].get("commit") == commit), key=lambda d: d["date"])


def median_us(doc: dict, N: int, T: int, label: str) -> float | None:
    for case in doc["cases"]:
        if (case["N"], case["T"]) == (N, T):
            row = case["results"].get(label)
            return row["median_s"] * 1e6 if row and "median_s" in row else None
    return None


def runs_us(docs: list[dict], N: int, T: int, label: str) -> list[float]:
    """The row's median in each run that timed it."""
    return [t for t in (median_us(d, N, T, label) for d in docs) if t is not None]


def mid(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def size(N: int, T: int) -> str:
    return f"{N // 1000}k T={T}"


def verdict(ok: bool | None) -> str:
    return "n/a" if ok is None else ("met" if ok else "**missed**")


def rows_peers(docs: list[dict]) -> list[tuple[str, str, bool | None]]:
    """The rows from one or more `peers` runs of one commit: each figure the median over the runs (a ratio: of the
    runs' ratios, each run's ours and FlashMLA timed on the same inputs), its range beside it when there are several."""
    docs = [docs] if isinstance(docs, dict) else docs
    mma = docs[-1]["default_label"]
    out = []

    def us(N, T, label=DISPATCH):
        return mid(runs_us(docs, N, T, label))

    def ratios(N, T, num=PEER, den=DISPATCH):
        return [n / d for n, d in ((median_us(x, N, T, num), median_us(x, N, T, den)) for x in docs) if n and d]

    def spread(xs, fmt):
        return f" (runs {fmt.format(min(xs))}-{fmt.format(max(xs))})" if len(xs) > 1 else ""

    for (N, T), limit in (((65536, 16), 40.0), ((65536, 64), 115.0), ((16384, 16), 30.0), ((4096, 16), 20.0)):
        t = us(N, T)
        out.append((f"sm90 {size(N, T)} <= {limit:g} us", "-" if t is None else
                    f"{t:.1f} us" + spread(runs_us(docs, N, T, DISPATCH), "{:.1f}"), None if t is None else t <= limit))
    for (N, T), want in (((65536, 16), 1.4), ((65536, 64), 1.07)):
        rs = ratios(N, T)
        ratio = mid(rs)
        out.append((f"sm90 {size(N, T)} >= {want:g}x FlashMLA", "-" if ratio is None else
                    f"{ratio:.3f}x ({us(N, T):.1f} against {us(N, T, PEER):.1f} us){spread(rs, '{:.3f}x')}",
                    None if ratio is None else ratio >= want))
    ratios_all = [(mid(ratios(N, T)), N, T) for N, T in SIZES if ratios(N, T)]
    worst = min(ratios_all) if ratios_all else None
    out.append(("sm90 no slower than FlashMLA at any size", "-" if worst is None else
                f"lowest {worst[0]:.3f}x ({size(worst[1], worst[2])}), {len(ratios_all)} sizes",
                None if worst is None else worst[0] >= 1.0))
    ratio = mid(ratios(65536, 16, TORCH))
    out.append(("sm90 65k T=16 >= 4x the unfused bf16 torch", "-" if ratio is None else f"{ratio:.2f}x",
                None if ratio is None else ratio >= 4.0))
    for (N, T), limit in (((65536, 16), 70.0), ((65536, 64), 260.0)):
        t = us(N, T, mma)
        out.append((f"mma.sync {size(N, T)} <= {limit:g} us (H200)", "-" if t is None else
                    f"{t:.1f} us" + spread(runs_us(docs, N, T, mma), "{:.1f}"), None if t is None else t <= limit))
    return out


def rows_nsplit(docs: list[dict]) -> list[tuple[str, str, bool | None]]:
    """auto NSPLIT within 3% of the best fixed count: the worst size of each path over the passes."""
    worst: dict[str, tuple[float, str]] = {}
    for doc in docs:
        for case, base, *_, ratio in kernel.nsplit2_pairs(doc):
            path = "sm90" if "sm90" in base else "mma.sync"
            if ratio > worst.get(path, (0.0, ""))[0]:
                worst[path] = (ratio, size(case["N"], case["T"]))
    return [(f"{path}: auto NSPLIT within 3% of the best fixed count", f"worst {r:.3f}x the best ({where}), "
             f"{len(docs)} passes", r <= 1.03) for path, (r, where) in sorted(worst.items(), reverse=True)]


MERGE, SPLIT_ONLY = kernel.MERGE_ROW, kernel.SPLIT_ONLY_ROW  # the `merge` set's rows


def rows_merge(docs: list[dict]) -> list[tuple[str, str, bool | None]]:
    """The merge's in-graph share on the sm90 path (the call with its merge less the split kernel alone, the median over
    the runs at each size): the worst size against 3 us."""
    share = {(N, T): mid([w - a for w, a in ((median_us(d, N, T, MERGE), median_us(d, N, T, SPLIT_ONLY)) for d in docs)
                          if w and a]) for N, T in SIZES}
    share = {k: v for k, v in share.items() if v is not None}
    if not share:
        return []
    (N, T), worst = max(share.items(), key=lambda kv: kv[1])
    return [("sm90 merge <= 3 us (the call less its split kernel alone)",
             f"worst {worst:.1f} us ({size(N, T)}); {min(share.values()):.1f}-{worst:.1f} us over {len(share)} sizes, "
             f"{len(docs)} runs", worst <= 3.0)]


def table() -> str:
    peers = latest("*_peers*.json", "peers")
    nsplit2 = latest("verify_kernel_nsplit2_*.json", "nsplit2")
    lines = ["| target | measured | |", "|---|---|---|"]
    sources = []
    if peers:
        doc = peers[-1]
        lines += [f"| {t} | {m} | {verdict(ok)} |" for t, m, ok in rows_peers(peers)]
        runs = f"{len(peers)} `peers` runs" if len(peers) > 1 else "`peers` record"
        sources.append(f"{runs} of {doc['fingerprint']['commit'][:7]} ({doc['date'][:10]}, "
                       f"{doc['fingerprint'].get('gpu', '?')}{'; medians over the runs' if len(peers) > 1 else ''})")
    merge = latest("*merge*.json", "merge")
    if merge:
        lines += [f"| {t} | {m} | {verdict(ok)} |" for t, m, ok in rows_merge(merge)]
        sources.append(f"`merge` records of {merge[-1]['fingerprint']['commit'][:7]} ({merge[-1]['date'][:10]})")
    if nsplit2:
        lines += [f"| {t} | {m} | {verdict(ok)} |" for t, m, ok in rows_nsplit(nsplit2)]
        sources.append(f"`nsplit2` records of {nsplit2[-1]['fingerprint']['commit'][:7]} ({nsplit2[-1]['date'][:10]})")
    head = ("Graph-replayed medians, L2 flushed, per layer, B=1, H=8, from `perf_history/kernel/`: the " +
            "; the ".join(sources) + ". Written by `python ci/gpu/targets.py --write README.md`.")
    return "\n".join([head, ""] + lines)


def replace_block(text: str, block: str) -> str:
    if BEGIN not in text or END not in text:
        raise SystemExit(f"targets: the markers {BEGIN!r} and {END!r} are not in the file")
    head, rest = text.split(BEGIN, 1)
    return head + BEGIN + "\n" + block + "\n" + END + rest.split(END, 1)[1]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--write", metavar="FILE", help="replace the block between the targets markers in FILE")
    g.add_argument("--check", metavar="FILE", help="exit 1 when FILE's targets block is not the records' table")
    args = p.parse_args(argv)
    block = table()
    if args.write or args.check:
        path = Path(args.write or args.check)
        if not path.is_file():
            verb = "write" if args.write else "check"
            print(f"targets: {path}: no such file (the README whose targets block to {verb})", file=sys.stderr)
            return 2
        text = path.read_text()
        new = replace_block(text, block)
        if args.check:
            if new != text:
                print(f"targets: {path}'s targets block differs from the records; run "
                      f"`python ci/gpu/targets.py --write {path}`", file=sys.stderr)
                return 1
            return 0
        path.write_text(new)
        return 0
    print(block)
    return 0


if __name__ == "__main__":
    sys.exit(main())
