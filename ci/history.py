"""Load an asv results directory (plus the samples sidecar) into runs: one run = one commit on one machine,
with one point per benchmark (median, samples, unit, direction, throttled). A file that cannot be read is a
DataError naming it, never skipped.

Layout (perf_history/README.md): <dir>/benchmarks.json, <dir>/<machine>/machine.json,
<dir>/<machine>/<sha8>-<env>.json (asv format v2), <dir>/samples/<machine>/<sha>.json (sidecar, schema 1).
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import statistics
from dataclasses import dataclass, field
from pathlib import Path

# Fingerprint fields that must agree for two runs to be compared (other GPU, driver, toolkit, torch).
COMPARABLE_KEYS = ("gpu", "sm_count", "driver", "cuda", "torch")
HIGHER_IS_BETTER_UNITS = ("tok/s", "tokens/s", "it/s", "ops/s", "GB/s", "TFLOP/s", "percent", "%")


class DataError(Exception):
    """A results file is missing, truncated or malformed; the message names the file."""


@dataclass
class Point:
    value: float  # median (or asv's result value)
    unit: str
    direction: str  # "lower" or "higher" is better
    samples: list[float] | None = None
    throttled: bool = False
    extra: dict = field(default_factory=dict)


@dataclass
class Run:
    commit: str
    machine: str
    date: float  # seconds since epoch (asv's commit date)
    points: dict[str, Point] = field(default_factory=dict)
    fingerprint: dict = field(default_factory=dict)
    throttled: bool = False
    paths: list[str] = field(default_factory=list)


# --- small helpers -------------------------------------------------------------------------------------


def direction_for_unit(unit: str | None) -> str:
    """'higher' for rates (tok/s, GB/s, ...), 'lower' for everything else (seconds, bytes)."""
    if unit and (unit in HIGHER_IS_BETTER_UNITS or unit.endswith("/s")):
        return "higher"
    return "lower"


def read_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"corrupt or unreadable result file {path}: {exc}") from None
    if not isinstance(data, dict):
        raise DataError(f"corrupt result file {path}: expected a JSON object, got {type(data).__name__}")
    return data


def asv_key(name: str, params: list[str] | tuple[str, ...]) -> str:
    """asv's display name of one parameter combination, e.g. bench.Verify.time_verify('triton', 4096)."""
    return f"{name}({', '.join(params)})" if params else name


def comparable(fp_a: dict, fp_b: dict) -> list[str]:
    """Fingerprint fields that differ (both known): empty when the runs may be compared."""
    diffs = []
    for key in COMPARABLE_KEYS:
        a, b = fp_a.get(key), fp_b.get(key)
        if a is not None and b is not None and a != b:
            diffs.append(f"{key}: {a} -> {b}")
    return diffs


def load_units(results_dir: Path) -> dict[str, str]:
    path = results_dir / "benchmarks.json"
    if not path.exists():
        return {}
    data = read_json(path)
    return {k: v.get("unit", "") for k, v in data.items() if isinstance(v, dict)}


def unit_from_name(name: str) -> str:
    method = name.rsplit(".", 1)[-1]
    if method.startswith("time_"):
        return "seconds"
    if method.startswith(("peakmem_", "mem_")):
        return "bytes"
    return "unit"


# --- asv result files ----------------------------------------------------------------------------------


def parse_asv_result(path: Path, units: dict[str, str]) -> tuple[dict, dict[tuple, tuple[str, Point]]]:
    """One asv v2 result file -> (header, {(asv_name, params): (display name, Point)})."""
    data = read_json(path)
    try:
        columns = data["result_columns"]
        rows = data["results"]
        header = {"commit": data["commit_hash"], "date": float(data.get("date") or 0) / 1000.0,
                  "params": data.get("params", {})}
        points = {}
        for name, row in rows.items():
            cols = dict(zip(columns, row, strict=False))
            unit = units.get(name) or unit_from_name(name)
            combos = [tuple(c) for c in itertools.product(*(cols.get("params") or []))] or [()]
            values = cols.get("result")
            values = values if isinstance(values, list) else [values]
            samples = cols.get("samples") or [None] * len(values)
            for combo, value, samp in zip(combos, values, samples, strict=True):
                if value is None or (isinstance(value, float) and value != value):
                    continue  # failed or skipped case (asv writes null / NaN)
                samp = [float(s) for s in samp] if samp else None
                points[(name, combo)] = (asv_key(name, combo),
                                         Point(float(value), unit, direction_for_unit(unit), samp))
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(f"malformed asv result file {path}: {exc!r}") from None
    return header, points


def apply_sidecar(run: Run, asv_points: dict, sidecar: dict, path: Path) -> None:
    """Rename points to the sidecar's stable workload names and attach samples, direction, throttling."""
    try:
        fp = sidecar.get("fingerprint") or {}
        run.fingerprint.update(fp)
        run.throttled = run.throttled or bool(fp.get("throttled"))
        for workload, res in sidecar["results"].items():
            key = (res.get("asv_name"), tuple(res.get("asv_params") or ()))
            display, point = asv_points.pop(key, (None, None))
            if display is not None:
                run.points.pop(display, None)
            samples = [float(s) for s in res.get("samples") or []] or (point.samples if point else None)
            unit = res.get("unit") or (point.unit if point else "unit")
            median = res.get("median")
            if median is None:
                median = statistics.median(samples) if samples else (point.value if point else None)
            if median is None:
                continue
            run.points[workload] = Point(
                float(median), unit, res.get("direction") or direction_for_unit(unit), samples,
                bool(res.get("throttled")) or bool(fp.get("throttled")), res.get("extra") or {})
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(f"malformed samples sidecar {path}: {exc!r}") from None


# --- the whole directory -------------------------------------------------------------------------------


def machine_dirs(results_dir: Path) -> list[Path]:
    return sorted(p.parent for p in results_dir.glob("*/machine.json"))


def load_machine(results_dir: Path, machine: str, units: dict[str, str] | None = None) -> list[Run]:
    """All runs of one machine, oldest first (by commit date, then commit)."""
    units = load_units(results_dir) if units is None else units
    runs: dict[str, Run] = {}
    asv_by_commit: dict[str, dict] = {}
    for path in sorted((results_dir / machine).glob("*.json")):
        if path.name == "machine.json":
            continue
        header, points = parse_asv_result(path, units)
        run = runs.setdefault(header["commit"], Run(header["commit"], machine, header["date"]))
        run.paths.append(str(path))
        for display, point in points.values():
            run.points[display] = point
        asv_by_commit.setdefault(header["commit"], {}).update(points)
        for key in ("cpu", "arch", "machine"):
            run.fingerprint.setdefault(key, header["params"].get(key))
    for path in sorted((results_dir / "samples" / machine).glob("*.json")):
        sidecar = read_json(path)
        commit = sidecar.get("commit") or path.stem
        run = runs.get(commit)
        if run is None:  # sidecar without an asv file: still a run
            run = runs[commit] = Run(commit, machine, _iso_to_epoch(sidecar.get("date")))
        run.paths.append(str(path))
        apply_sidecar(run, asv_by_commit.get(commit, {}), sidecar, path)
    return sorted(runs.values(), key=lambda r: (r.date, r.commit))


def load_all(results_dir: str | Path, machine: str | None = None) -> dict[str, list[Run]]:
    """{machine: runs oldest first} for every machine directory (or just `machine`)."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise DataError(f"results directory {results_dir} does not exist")
    units = load_units(results_dir)
    names = [p.name for p in machine_dirs(results_dir)]
    sidecar_root = results_dir / "samples"
    if sidecar_root.is_dir():
        names += [p.name for p in sidecar_root.iterdir() if p.is_dir() and p.name not in names]
    if machine is not None:
        names = [n for n in names if n == machine]
    return {name: load_machine(results_dir, name, units) for name in sorted(names)}


def find_run(runs: list[Run], sha: str) -> Run | None:
    """The run whose commit starts with `sha` (a full or abbreviated hash)."""
    matches = [r for r in runs if r.commit.startswith(sha) or sha.startswith(r.commit)]
    return matches[-1] if matches else None


def match_pattern(name: str, patterns: dict[str, float]) -> float | None:
    """The value of the most specific glob pattern matching `name` (exact name first, then longest)."""
    if name in patterns:
        return patterns[name]
    hits = [p for p in patterns if fnmatch.fnmatchcase(name, p)]
    return patterns[max(hits, key=len)] if hits else None


def _iso_to_epoch(text: str | None) -> float:
    from datetime import datetime

    if not text:
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
