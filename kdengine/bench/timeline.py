"""The in-kernel timeline of one verify call (csrc/verify_timeline.cuh, the -DKDENGINE_TIMELINE build), summarised:
where the split -> merge hand-off spends its time. Pure Python on the records `timeline_read()` returns (rows of kind,
block, smid, t_ns), so the CPU tests run it on synthetic records; ci/gpu/timeline.py takes the records on the device.

Every time is in ns relative to the first split block's start (t0; the earliest record when no split start was
recorded). The %globaltimer's granularity bounds what the figures can resolve: `granularity_ns` is the smallest
non-zero difference between two records' times (on some GPUs the timer advances in 1 us steps unless a profiler
raises its rate; then nothing below ~1 us is resolved).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

# The record kinds, in csrc/verify_timeline.cuh's enum order (tests/bench/test_timeline.py checks the header).
KINDS = ("split_start", "split_trigger", "split_end", "merge_start", "merge_waited", "merge_end", "split_step1",
         "split_last_step", "split_issued", "split_q_ready", "split_s0", "split_q_issued", "split_row0",
         "split_t0_issued", "split_s1", "split_entry", "split_sissue0_a", "split_sissue0_b", "split_sissue1_a",
         "split_sissue1_b")
(SPLIT_START, SPLIT_TRIGGER, SPLIT_END, MERGE_START, MERGE_WAITED, MERGE_END, SPLIT_STEP1, SPLIT_LAST_STEP,
 SPLIT_ISSUED, SPLIT_Q_READY, SPLIT_S0, SPLIT_Q_ISSUED, SPLIT_ROW0, SPLIT_T0_ISSUED, SPLIT_S1, SPLIT_ENTRY,
 SPLIT_SISSUE0_A, SPLIT_SISSUE0_B, SPLIT_SISSUE1_A, SPLIT_SISSUE1_B) = range(len(KINDS))
# Kinds whose t_ns is a duration (ns), not a time: seesaw2's S issues in its tile loop summed over the steps, per
# warpgroup and call (each its chunks' full-barrier waits, the reloads' exposed latency, and its wgmma issues)
S_ISSUES = {SPLIT_SISSUE0_A: "loop S issues, warpgroup 0, chunks 0-3",
            SPLIT_SISSUE0_B: "loop S issues, warpgroup 0, chunks 4-8",
            SPLIT_SISSUE1_A: "loop S issues, warpgroup 1, chunks 4-8",
            SPLIT_SISSUE1_B: "loop S issues, warpgroup 1, chunks 0-3"}
DURATION_KINDS = frozenset(S_ISSUES)
MERGE_KINDS = frozenset((MERGE_START, MERGE_WAITED, MERGE_END))
# The split kernel's kinds (the rest are the merge's); the step and prologue marks come from the sm90 seesaw2 kernel.
SPLIT_KINDS = frozenset(range(len(KINDS))) - MERGE_KINDS
# The sm90 seesaw2 prologue's marks in the order a block passes them (thread 0, then warpgroup 1's first S), each
# reported as the median over blocks of its time since the block's start (its first barrier passed: the entry, before
# that barrier, reads negative; a probe that issues loads ahead of the barrier compares with seesaw2 from the entry)
PROLOGUE = {SPLIT_ENTRY: "entry (before the first barrier)", SPLIT_Q_ISSUED: "Q issued",
            SPLIT_ROW0: "tile 0's page looked up", SPLIT_T0_ISSUED: "tile 0 issued", SPLIT_ISSUED: "tile 1 issued",
            SPLIT_Q_READY: "Q landed", SPLIT_S0: "first S done (tile 0, warpgroup 0)",
            SPLIT_S1: "first S done (tile 1, warpgroup 1)"}
COARSE_NS = 500  # a granularity at or above this: the timeline cannot resolve the merge's ~3 us share


@dataclass(frozen=True)
class Spread:
    """First, median and last time (ns after t0) of one kind over the blocks that recorded it."""

    n: int
    first: float
    median: float
    last: float


@dataclass(frozen=True)
class TimelineSummary:
    t0_ns: int  # absolute %globaltimer of t0
    kinds: dict[str, Spread | None]  # per KINDS name; None: no record of that kind
    split_blocks: int  # split blocks with any record
    empty_splits: int  # split blocks with an end but no start (an empty split records its end only)
    merge_blocks: int  # merge blocks with any record
    merge_started_before_split_end: int  # merge blocks whose start precedes the last split block's end
    release_ns: float | None  # first merge wait release - last split end
    merge_tail_ns: float | None  # last merge end - last split end: the merge's share of the call
    split_sms: int  # distinct SMs that ran split blocks
    merge_sms: int  # distinct SMs that ran merge blocks
    granularity_ns: int | None  # smallest non-zero difference between two records' times
    distinct_times: int  # distinct timestamps among the records
    # the sm90 seesaw2 kernel's step marks, medians over the blocks that recorded start, both marks and the trigger
    # (None without them): start -> step 1 (the prologue and step 0), step 1 -> the last step (the steady loop),
    # the last step -> the trigger (the last step and the loop's drain)
    prologue_ns: float | None = None
    steady_ns: float | None = None
    last_step_ns: float | None = None
    # the prologue's marks (PROLOGUE's kinds -> the median over the blocks that recorded start and the mark of its time
    # since the block's start; None without such blocks)
    prologue_marks_ns: dict[int, float | None] | None = None
    # S_ISSUES' kinds -> the median over the blocks that recorded it of its duration (ns; None without such blocks)
    s_issues_ns: dict[int, float | None] | None = None

    @property
    def coarse(self) -> bool:
        return self.granularity_ns is not None and self.granularity_ns >= COARSE_NS


# --- summary ----------------------------------------------------------------------------------------


def _spread(times: Sequence[int]) -> Spread | None:
    if not times:
        return None
    ordered = sorted(times)
    return Spread(len(ordered), float(ordered[0]), float(statistics.median(ordered)), float(ordered[-1]))


def granularity(times: Iterable[int]) -> int | None:
    """The smallest non-zero difference between two of the times (None for fewer than two distinct ones)."""
    distinct = sorted(set(times))
    steps = [b - a for a, b in zip(distinct, distinct[1:], strict=False)]
    return min(steps) if steps else None


def summarize(records: Iterable[Sequence[int]]) -> TimelineSummary:
    """The summary of one call's records: rows (kind, block, smid, t_ns) as timeline_read() returns them (a tensor's
    .tolist() or any sequence of 4-sequences; DURATION_KINDS' t_ns are durations, kept out of the times). Raises
    ValueError when there are none or a kind is unknown."""
    every = [tuple(int(v) for v in r) for r in records]
    if not every:
        raise ValueError("records: expected at least one timeline record, got none (was the timeline build loaded?)")
    bad = sorted({r[0] for r in every if not 0 <= r[0] < len(KINDS)})
    if bad:
        raise ValueError(f"records: unknown kinds {bad} (expected 0..{len(KINDS) - 1}: {', '.join(KINDS)})")
    durations = {k: [r[3] for r in every if r[0] == k] for k in DURATION_KINDS}
    rows = [r for r in every if r[0] not in DURATION_KINDS]  # times: the rest
    if not rows:
        raise ValueError("records: only durations, no timeline record with a time")
    starts = [r[3] for r in rows if r[0] == SPLIT_START]
    t0 = min(starts) if starts else min(r[3] for r in rows)
    times = {k: [r[3] - t0 for r in rows if r[0] == k] for k in range(len(KINDS))}
    blocks = {k: {r[1] for r in rows if r[0] == k} for k in range(len(KINDS))}
    split_blocks = blocks[SPLIT_START] | blocks[SPLIT_TRIGGER] | blocks[SPLIT_END]
    merge_blocks = blocks[MERGE_START] | blocks[MERGE_WAITED] | blocks[MERGE_END]
    last_split_end = max(times[SPLIT_END]) if times[SPLIT_END] else None
    at = {k: {} for k in range(len(KINDS))}  # kind -> {block: t_ns}
    for r in rows:
        at[r[0]][r[1]] = r[3]
    steps = (SPLIT_START, SPLIT_STEP1, SPLIT_LAST_STEP, SPLIT_TRIGGER)
    stepped = [b for b in at[SPLIT_STEP1] if all(b in at[k] for k in steps)]
    between = lambda k0, k1: float(statistics.median(at[k1][b] - at[k0][b] for b in stepped)) if stepped else None

    def since_start(kind: int) -> float | None:
        marked = [b for b in at[SPLIT_START] if b in at[kind]]
        return float(statistics.median(at[kind][b] - at[SPLIT_START][b] for b in marked)) if marked else None

    after_last = lambda kind, pick: pick(times[kind]) - last_split_end if times[kind] and last_split_end is not None \
        else None
    return TimelineSummary(
        t0_ns=t0,
        kinds={name: _spread(durations[k] if k in DURATION_KINDS else times[k]) for k, name in enumerate(KINDS)},
        split_blocks=len(split_blocks),
        empty_splits=len(blocks[SPLIT_END] - blocks[SPLIT_START]),
        merge_blocks=len(merge_blocks),
        merge_started_before_split_end=0 if last_split_end is None
        else sum(t < last_split_end for t in times[MERGE_START]),
        release_ns=after_last(MERGE_WAITED, min),
        merge_tail_ns=after_last(MERGE_END, max),
        split_sms=len({r[2] for r in rows if r[0] in SPLIT_KINDS}),
        merge_sms=len({r[2] for r in rows if r[0] not in SPLIT_KINDS}),
        granularity_ns=granularity(r[3] for r in rows),
        distinct_times=len({r[3] for r in rows}),
        prologue_ns=between(SPLIT_START, SPLIT_STEP1),
        steady_ns=between(SPLIT_STEP1, SPLIT_LAST_STEP),
        last_step_ns=between(SPLIT_LAST_STEP, SPLIT_TRIGGER),
        prologue_marks_ns={k: since_start(k) for k in PROLOGUE},
        s_issues_ns={k: float(statistics.median(v)) if v else None for k, v in durations.items()},
    )


# --- text -------------------------------------------------------------------------------------------


def _us(ns: float | None) -> str:
    return "-" if ns is None else f"{ns / 1e3:8.2f}"


def format_summary(s: TimelineSummary, title: str = "") -> str:
    """A few lines: per kind first / median / last (us after t0), then the hand-off figures."""
    lines = [f"{title}{' ' if title else ''}times in us after the first split block's start"
             f" ({s.split_blocks} split blocks on {s.split_sms} SMs, {s.empty_splits} empty;"
             f" {s.merge_blocks} merge blocks on {s.merge_sms} SMs)",
             f"  {'kind':14s} {'n':>6s} {'first':>8s} {'median':>8s} {'last':>8s} {'spread':>8s}"]
    for name, sp in s.kinds.items():
        if KINDS.index(name) in DURATION_KINDS:
            name += " (a duration)"
        if sp is None:
            lines.append(f"  {name:14s} {0:6d} {'-':>8s} {'-':>8s} {'-':>8s} {'-':>8s}")
        else:
            lines.append(f"  {name:14s} {sp.n:6d} {_us(sp.first)} {_us(sp.median)} {_us(sp.last)}"
                         f" {_us(sp.last - sp.first)}")
    lines.append(f"  merge blocks started before the last split block ended: {s.merge_started_before_split_end}")
    lines.append(f"  last split end -> first merge wait release: {_us(s.release_ns).strip()} us;"
                 f" -> last merge end: {_us(s.merge_tail_ns).strip()} us")
    gran = "-" if s.granularity_ns is None else f"{s.granularity_ns} ns"
    lines.append(f"  %globaltimer granularity (smallest non-zero step): {gran}, {s.distinct_times} distinct times")
    if s.coarse:
        lines.append(f"  NOTE: the timer advances in steps of ~{s.granularity_ns / 1e3:.1f} us: figures below that"
                     " are not resolved (the split -> merge hand-off is ~3 us)")
    return "\n".join(lines)


# --- over repeats -------------------------------------------------------------------------------------

# Per-call figures aggregated over the repeats of one size (name -> how it is read off a summary, in ns or a count).
AGGREGATE_FIGURES = {
    "last split end": lambda s: s.kinds["split_end"].last if s.kinds["split_end"] else None,
    "split end spread": lambda s: s.kinds["split_end"].last - s.kinds["split_end"].first if s.kinds["split_end"] else None,
    "release after last split end": lambda s: s.release_ns,
    "merge work (release -> last merge end)": lambda s: s.kinds["merge_end"].last - s.kinds["merge_waited"].first
    if s.kinds["merge_end"] and s.kinds["merge_waited"] else None,
    "last split end -> last merge end": lambda s: s.merge_tail_ns,
    "merge SMs": lambda s: s.merge_sms,
    **{f"start -> {label} (median block; sm90)": (lambda s, k=k: (s.prologue_marks_ns or {}).get(k))
       for k, label in PROLOGUE.items()},
    "start -> step 1 (median block; sm90)": lambda s: s.prologue_ns,
    **{f"{label} (median block, all steps; sm90)": (lambda s, k=k: (s.s_issues_ns or {}).get(k))
       for k, label in S_ISSUES.items()},
    "step 1 -> last step (median block; sm90)": lambda s: s.steady_ns,
    "last step -> trigger (median block; sm90)": lambda s: s.last_step_ns,
}


def format_aggregate(summaries: Sequence[TimelineSummary], title: str = "") -> str:
    """Median and range over the repeats of one size, per AGGREGATE_FIGURES (times in us, "merge SMs" a count): where
    one replay differs from another (the merge's SMs, the split kernel's end), a few replays cannot say which figure
    moves with which."""
    if not summaries:
        raise ValueError("summaries: expected the summaries of at least one repeat, got none")
    lines = [f"{title}{' ' if title else ''}over {len(summaries)} repeats: median [min, max]"]
    for name, read in AGGREGATE_FIGURES.items():
        values = [v for v in (read(s) for s in summaries) if v is not None]
        if not values:
            lines.append(f"  {name:40s} -")
            continue
        scale, unit = (1, "") if name == "merge SMs" else (1e3, " us")
        med, lo, hi = (statistics.median(values) / scale, min(values) / scale, max(values) / scale)
        lines.append(f"  {name:40s} {med:8.2f} [{lo:.2f}, {hi:.2f}]{unit}")
    return "\n".join(lines)

