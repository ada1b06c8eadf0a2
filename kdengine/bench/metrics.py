"""The one table of what every benchmark metric measures: its unit and which direction is better.

The asv suites (benchmarks/common.metric), the samples sidecar (samples.make_record), the gate and the report
all read this table; a unit or direction it does not know is an error naming where it came from. Metrics
whose direction is "info" are recorded and shown but never gated (a phase share, an imbalance ratio).

Keys are asv benchmark names (`<module>.<Class>.<method>`), the names asv writes into benchmarks.json and
the result files. Benchmarks of other projects (public asv histories read by `python -m ci evaluate`) are
not in the table: they follow asv's own convention (any unit, a larger value is worse).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

DIRECTIONS = ("lower", "higher", "info")

# unit -> True when the value must be > 0 (a time, a rate, a size); False when any finite value is fine
UNITS = {
    "seconds": True,
    "tok/s": True,
    "bytes": True,
    "percent": False,
    "tokens": False,
    "ratio": False,
    "count": False,
    "unit": False,  # asv's default unit of a track_ benchmark
}


@dataclass(frozen=True)
class Metric:
    unit: str
    direction: str  # "lower" / "higher" is better, or "info" (never gated)


# % of the roofline floor is the time seen through a measured ceiling: the time is gated, the % is shown (a
# re-measured ceiling moves every % at once; gating both would count one change twice).
METRICS: dict[str, Metric] = {
    "bench_verify.Verify.track_time": Metric("seconds", "lower"),
    "bench_verify.Verify.track_roofline_pct": Metric("percent", "info"),
    "bench_verify.VerifyNsplit.track_time": Metric("seconds", "lower"),
    "bench_verify.CpuVerify.track_time": Metric("seconds", "lower"),
    "bench_verify.CpuVerify.track_roofline_pct": Metric("percent", "info"),
    "bench_decode.Decode.track_tok_per_s": Metric("tok/s", "higher"),
    "bench_decode.Decode.track_mean_accept": Metric("tokens", "higher"),
    "bench_decode.Decode.track_attention_share": Metric("percent", "info"),
    "bench_decode.Decode.track_step_over_floor": Metric("ratio", "info"),  # step time / its memory floor
    "bench_decode.CpuDecode.track_tok_per_s": Metric("tok/s", "higher"),
    "bench_decode.CpuDecode.track_mean_accept": Metric("tokens", "higher"),
    "bench_decode.TreeBuild.track_time": Metric("seconds", "lower"),
    "bench_decode.CpuTreeBuild.track_time": Metric("seconds", "lower"),
    "bench_decode.DecodeInt4.track_tok_per_s": Metric("tok/s", "higher"),
    "bench_decode.DecodeInt4.track_moe_share": Metric("percent", "info"),
    "bench_decode.DecodeInt4.track_experts_touched": Metric("count", "info"),
    # the peer (FlashMLA) on our shapes: our commits cannot change it, so ci/thresholds.toml never lets it
    # fail the build; its history shows the machine's drift next to ours
    "bench_verify.VerifyPeer.track_time": Metric("seconds", "lower"),
    "bench_verify.VerifyPeer.track_roofline_pct": Metric("percent", "info"),
    "bench_tp.TPDecode.track_tok_per_s": Metric("tok/s", "higher"),
    "bench_tp.TPDecode.track_all_reduce_share": Metric("percent", "info"),
    "bench_tp.TPDecode.track_moe_rank_imbalance": Metric("ratio", "info"),
}


def lookup(asv_name: str) -> Metric | None:
    """The table's entry for an asv benchmark name, or None for a benchmark this project does not own."""
    return METRICS.get(asv_name)


def check_unit(unit: object, direction: object, where: str) -> None:
    """ValueError naming `where` unless unit and direction are known."""
    if unit not in UNITS:
        raise ValueError(f"{where}: unknown unit {unit!r} (known: {', '.join(sorted(UNITS))})")
    if direction not in DIRECTIONS:
        raise ValueError(f"{where}: unknown direction {direction!r} (expected one of {DIRECTIONS})")


def check_entry(asv_name: str | None, unit: object, direction: object, where: str) -> Metric:
    """The metric of a recorded result: known unit and direction, and equal to the table's entry when the
    benchmark is in the table. ValueError naming `where` otherwise."""
    check_unit(unit, direction, where)
    known = lookup(asv_name) if asv_name else None
    if known is not None and (known.unit, known.direction) != (unit, direction):
        raise ValueError(f"{where}: {asv_name} is {known.unit} ({known.direction} is better) in "
                         f"kdengine.bench.metrics, but the file says {unit} ({direction})")
    return Metric(str(unit), str(direction))


def check_values(values: list, unit: str, where: str) -> list[float]:
    """check_value for a whole list: the floats, or ValueError naming `where` and the first bad value.
    Fast path for the common case (history files hold millions of samples): a NaN or inf makes the sum
    non-finite, so one sum and one min decide a list of good floats."""
    try:
        total = math.fsum(values)  # TypeError for anything that is not a number
        if math.isfinite(total) and (not UNITS.get(unit) or min(values) > 0) and not isinstance(values, str):
            return list(map(float, values))
    except (TypeError, ValueError):
        pass
    return [check_value(v, unit, where) for v in values]  # raises at the first bad value


def check_value(value: object, unit: str, where: str) -> float:
    """The value as a float: finite, and > 0 for times, rates and sizes. ValueError naming `where`."""
    if isinstance(value, (str, bytes, bool)):
        raise ValueError(f"{where}: expected a number, got {value!r}")
    try:
        number = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"{where}: expected a number, got {value!r}") from None
    if not math.isfinite(number):
        raise ValueError(f"{where}: non-finite value {number!r}")
    if UNITS.get(unit) and number <= 0:
        raise ValueError(f"{where}: {unit} must be > 0, got {number!r}")
    return number
