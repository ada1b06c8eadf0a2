"""kdengine.bench.timeline on synthetic records (rows kind, block, smid, t_ns): the figures of the split -> merge
hand-off, a call with records missing (an empty split, a merge block past the buffer), the timer granularity."""

from __future__ import annotations

import pytest

from kdengine.bench import timeline as tl

T0 = 1_700_000_000_000_000_000  # a %globaltimer-like absolute time


def call_records(step: int = 1):
    """4 split blocks starting at 0, 100, 200, 300 ns (block 3 empty: only its end, at 300), triggering 1000 ns after
    their start, ending 200 ns after the trigger; 3 merge blocks starting at 900, 1300, 1600, released at 1700, ending
    at 2000, 2100, 2300. Times rounded down to `step` (the timer's granularity)."""
    q = lambda t: T0 + t // step * step
    rows = []
    for b in range(3):
        rows += [(tl.SPLIT_START, b, b, q(100 * b)), (tl.SPLIT_TRIGGER, b, b, q(100 * b + 1000)),
                 (tl.SPLIT_END, b, b, q(100 * b + 1200))]
    rows.append((tl.SPLIT_END, 3, 3, q(300)))  # the empty split: its end only
    for b, (start, end) in enumerate([(900, 2000), (1300, 2100), (1600, 2300)]):
        rows += [(tl.MERGE_START, b, 10 + b, q(start)), (tl.MERGE_WAITED, b, 10 + b, q(1700)),
                 (tl.MERGE_END, b, 10 + b, q(end))]
    return rows


def test_the_hand_off_figures():
    s = tl.summarize(call_records())
    assert s.t0_ns == T0
    assert s.kinds["split_start"] == tl.Spread(3, 0, 100, 200)
    assert s.kinds["split_trigger"] == tl.Spread(3, 1000, 1100, 1200)
    assert s.kinds["split_end"] == tl.Spread(4, 300, 1250, 1400)  # the empty split's end is the first
    assert s.kinds["merge_start"] == tl.Spread(3, 900, 1300, 1600)
    assert s.kinds["merge_waited"] == tl.Spread(3, 1700, 1700, 1700)
    assert s.kinds["merge_end"] == tl.Spread(3, 2000, 2100, 2300)
    assert (s.split_blocks, s.empty_splits, s.merge_blocks) == (4, 1, 3)
    assert s.merge_started_before_split_end == 2  # 900 and 1300 precede the last split end, 1400
    assert s.release_ns == 300 and s.merge_tail_ns == 900
    assert (s.split_sms, s.merge_sms) == (4, 3)
    assert s.granularity_ns == 100 and not s.coarse


def test_records_missing():
    rows = [r for r in call_records() if not (r[0] == tl.MERGE_END and r[1] == 2)]  # a merge block past the buffer
    s = tl.summarize(rows)
    assert s.kinds["merge_end"] == tl.Spread(2, 2000, 2050, 2100) and s.merge_tail_ns == 700
    merge_only = tl.summarize([r for r in call_records() if r[0] >= tl.MERGE_START])  # no split record at all
    assert merge_only.t0_ns == T0 + 900  # the earliest record
    assert merge_only.kinds["split_start"] is None and merge_only.release_ns is None
    assert merge_only.merge_started_before_split_end == 0
    assert "split_start" in tl.format_summary(merge_only)
    with pytest.raises(ValueError, match="no"):
        tl.summarize([])
    with pytest.raises(ValueError, match="unknown kinds"):
        tl.summarize([(len(tl.KINDS), 0, 0, T0)])


def test_the_step_marks():
    """Per block start -> step 1 -> last step -> trigger, medians over the blocks with all four (a block past the
    buffer of one kind drops out); the marks' SMs count as split SMs; without marks the figures are None."""
    rows = call_records()
    assert tl.summarize(rows).prologue_ns is None and tl.summarize(rows).steady_ns is None
    for b, (s1, last) in enumerate([(300, 800), (450, 1000), (500, 1100)]):  # starts 0, 100, 200; triggers +1000
        rows += [(tl.SPLIT_STEP1, b, 20 + b, T0 + s1), (tl.SPLIT_LAST_STEP, b, 20 + b, T0 + last)]
    rows.append((tl.SPLIT_STEP1, 7, 7, T0 + 50))  # a block with no other record: left out
    s = tl.summarize(rows)
    assert (s.prologue_ns, s.steady_ns, s.last_step_ns) == (300, 550, 100)  # medians of (300, 350, 300), ...
    assert s.kinds["split_step1"] == tl.Spread(4, 50, 375, 500) and s.kinds["split_last_step"].n == 3
    assert (s.split_sms, s.merge_sms) == (8, 3)
    text = tl.format_aggregate([s, s])
    assert "step 1 -> last step (median block; sm90)" in text and "0.55 [0.55, 0.55] us" in text


def test_the_prologue_marks():
    """start -> each prologue mark (tile 1 issued, Q landed, first S done, ...), medians over the blocks with start and
    that mark (each mark on its own: a block without one still counts for the others); without them None."""
    rows = call_records()  # starts 0, 100, 200
    assert set(tl.summarize(rows).prologue_marks_ns.values()) == {None}
    for b, (issued, q, s0) in enumerate([(40, 900, 2000), (160, 1100, 2600), (None, 1250, 2400)]):
        if issued is not None:
            rows.append((tl.SPLIT_ISSUED, b, 20 + b, T0 + issued))
        rows += [(tl.SPLIT_Q_READY, b, 20 + b, T0 + q), (tl.SPLIT_S0, b, 20 + b, T0 + s0)]
    rows.append((tl.SPLIT_S0, 9, 9, T0 + 10))  # a block without a start: left out
    s = tl.summarize(rows)
    marks = s.prologue_marks_ns
    # medians of (40, 60), (900, 1000, 1050), (2000, 2500, 2200)
    assert (marks[tl.SPLIT_ISSUED], marks[tl.SPLIT_Q_READY], marks[tl.SPLIT_S0]) == (50, 1000, 2200)
    assert s.kinds["split_s0"].n == 4 and s.split_sms == 8  # 0-3, the marks' 20-22 and 9
    text = tl.format_aggregate([s])
    assert "start -> Q landed (median block; sm90)" in text and "1.00 [1.00, 1.00] us" in text
    rows.append((tl.SPLIT_ENTRY, 0, 20, T0 - 300))  # before the block's start: negative
    assert tl.summarize(rows).prologue_marks_ns[tl.SPLIT_ENTRY] == -300
    assert "start -> Q issued (median block; sm90)" in text  # a mark no block recorded: "-"
    assert "-" == text.split("start -> Q issued (median block; sm90)")[1].split("\n")[0].strip()


def test_the_loop_s_issues_are_durations_not_times():
    """The S issue records hold ns summed over a block's steps: medians over blocks, kept out of t0, the granularity
    and every time figure; a record set of durations alone is refused."""
    rows = call_records()
    plain = tl.summarize(rows)
    for b, (a, bb) in enumerate([(900, 50), (1500, 70), (1200, 60)]):  # a duration far below T0: not a time
        rows += [(tl.SPLIT_SISSUE0_A, b, 20 + b, a), (tl.SPLIT_SISSUE1_B, b, 20 + b, bb)]
    s = tl.summarize(rows)
    assert (s.t0_ns, s.granularity_ns, s.distinct_times) == (plain.t0_ns, plain.granularity_ns, plain.distinct_times)
    assert s.s_issues_ns[tl.SPLIT_SISSUE0_A] == 1200 and s.s_issues_ns[tl.SPLIT_SISSUE1_B] == 60
    assert s.s_issues_ns[tl.SPLIT_SISSUE0_B] is None
    assert s.kinds["split_sissue0_a"] == tl.Spread(3, 900, 1200, 1500)
    assert "split_sissue0_a (a duration)" in tl.format_summary(s)
    assert "loop S issues, warpgroup 0, chunks 0-3 (median block, all steps; sm90)     1.20" in tl.format_aggregate([s])
    with pytest.raises(ValueError, match="only durations"):
        tl.summarize([(tl.SPLIT_SISSUE0_A, 0, 0, 900)])


def test_a_coarse_timer_is_reported():
    s = tl.summarize(call_records(step=1000))  # a timer that advances every microsecond
    assert s.granularity_ns == 1000 and s.coarse and s.distinct_times == 3
    assert s.kinds["split_start"] == tl.Spread(3, 0, 0, 0)
    assert "NOTE" in tl.format_summary(s)
    assert tl.granularity([5, 5, 7, 10]) == 2 and tl.granularity([5, 5]) is None


def test_the_summary_text():
    text = tl.format_summary(tl.summarize(call_records()), "ctx65536 T64:")
    assert text.startswith("ctx65536 T64: times in us")
    assert "merge blocks started before the last split block ended: 2" in text
    assert "first merge wait release: 0.30 us" in text and "last merge end: 0.90 us" in text
    assert "granularity (smallest non-zero step): 100 ns" in text and "NOTE" not in text


def test_the_device_script_has_help(capsys):
    import runpy
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "ci" / "gpu" / "timeline.py"
    argv = sys.argv
    sys.argv = [str(script), "--help"]
    try:
        with pytest.raises(SystemExit) as done:
            runpy.run_path(str(script), run_name="__main__")
    finally:
        sys.argv = argv
    assert done.value.code == 0
    assert "kdengine.ops.build --arch native --timeline" in capsys.readouterr().out


def test_the_figures_over_repeats():
    one = tl.summarize(call_records())
    later = tl.summarize([(k, b, sm, t + (300 if k >= tl.MERGE_START else 0)) for k, b, sm, t in call_records()])
    text = tl.format_aggregate([one, later, one], "ctx65536 T64:")
    assert text.startswith("ctx65536 T64: over 3 repeats: median [min, max]")
    lines = {line[:42].strip(): line[42:].strip() for line in text.splitlines()[1:]}
    assert lines["last split end"] == "1.40 [1.40, 1.40] us"
    assert lines["split end spread"] == "1.10 [1.10, 1.10] us"  # the empty split's end at 300 ns is the first
    assert lines["release after last split end"] == "0.30 [0.30, 0.60] us"  # the merge 300 ns later in one repeat
    assert lines["merge work (release -> last merge end)"] == "0.60 [0.60, 0.60] us"
    assert lines["last split end -> last merge end"] == "0.90 [0.90, 1.20] us"
    assert lines["merge SMs"] == "3.00 [3.00, 3.00]"
    merge_only = tl.summarize([r for r in call_records() if r[0] >= tl.MERGE_START])
    assert "last split end                           -" in tl.format_aggregate([merge_only])
    with pytest.raises(ValueError, match="summaries"):
        tl.format_aggregate([])
