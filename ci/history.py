"""Load an asv results directory (plus the samples sidecars) into runs as they really happened.

One run = one measurement of one commit in one environment on one machine, with one point per benchmark
(median, samples, unit, direction, throttled, benchmark version). Two runs of one commit (a rerun, an A/A
pair) stay two runs; two environments of one commit (py3.9 and py3.13) are never merged. History is
ordered by the base branch's first-parent order when a repository is given, else by when the runs were
made (asv's started_at, the sidecar's run id), never by a commit's author date.

Bad input is a DataError naming the file: malformed JSON, unknown units or directions, non-finite, zero or
negative times and rates, two asv files for one commit and environment, symlinks, FIFOs and other
non-regular entries (refused, never followed), a directory a record was interrupted in (its journal is
there until `python -m ci record --recover`). Files a comparison may not need (an asv file of the old
format) are set aside with asv's own advice and only become an error when the gate needs that commit.

Layout (perf_history/README.md): <dir>/benchmarks.json, <dir>/<machine>/machine.json,
<dir>/<machine>/<sha8>-<env>.json (asv format v2), <dir>/samples/<machine>/<sha>-<run_id>.json (sidecar
schema 2; <sha>.json is schema 1).
"""

from __future__ import annotations

import fnmatch
import itertools
import json
import os
import stat
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from kdengine.bench import metrics
from kdengine.bench import samples as sidecars

# Fingerprint fields that must agree for two runs to be compared (other GPU, driver, toolkit, torch).
# "overrides": the KDENGINE_* variables that change what is measured (kdengine.env.MEASUREMENT_VARS; runs
# recorded before it existed lack the key and compare with either)
COMPARABLE_KEYS = ("gpu", "sm_count", "driver", "cuda", "torch", "overrides", "verify_timer")
# What a GPU run recorded before a key existed held, where that is known and must not read as unknown (unknown
# compares with anything): verify_timer (kdengine.bench.verify_timing.METHOD): such runs took their verify samples
# back to back, so at heavy sizes under the power cap, and a run of the new method is not compared with them (its
# 65k figures moved with the method, not the code).
LEGACY_GPU_FIELDS = {"verify_timer": "back-to-back"}
ASV_RESULT_VERSION = 2
MIN_PREFIX = 4  # shortest abbreviated sha accepted
RECORD_JOURNAL = ".record-journal.json"  # ci/record.py's install journal: while it exists, results are half-written


class DataError(Exception):
    """A results file is missing, truncated or malformed, or a commit cannot be resolved; the message names
    the file or the candidates."""


class UnknownCommit(DataError):
    """A commit that has no results here (other machines may have some)."""


@dataclass
class Point:
    value: float  # median (or asv's result value)
    unit: str
    direction: str  # "lower" or "higher" is better, "info" (never gated)
    samples: list[float] | None = None
    throttled: bool = False
    extra: dict = field(default_factory=dict)
    version: str | None = None  # asv's benchmark version: a change starts a new series


@dataclass
class Run:
    commit: str
    machine: str
    date: float  # when the run was made (seconds since epoch); orders runs without a repository
    points: dict[str, Point] = field(default_factory=dict)
    fingerprint: dict = field(default_factory=dict)
    throttled: bool = False
    paths: list[str] = field(default_factory=list)
    env: str | None = None  # asv's env_name (python and environment): part of the identity
    run_id: str = ""  # the sidecar's run id ("" for a run known from its asv file only)
    has_samples: bool = False  # a samples sidecar belongs to this run
    branch: str | None = None  # the tracked branch that held the commit when it ran (sidecar; None: none or unknown)

    @property
    def label(self) -> str:
        return f"{self.commit[:10]}" + (f" run {self.run_id}" if self.run_id else "")


@dataclass
class MachineHistory:
    machine: str
    runs: list[Run]  # in the order they were made
    set_aside: dict[str, str] = field(default_factory=dict)  # path -> why it was not read (old format)
    old_format_commits: dict[str, str] = field(default_factory=dict)  # commit -> path of its old file


# --- small helpers -------------------------------------------------------------------------------------


def check_regular(path: Path) -> None:
    """DataError unless `path` is a regular file or directory that is not a symlink (never followed)."""
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise DataError(f"cannot stat {path}: {exc}") from None
    if stat.S_ISLNK(mode):
        raise DataError(f"{path} is a symbolic link: refused (results are read from regular files only)")
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise DataError(f"{path} is not a regular file (FIFO, device or socket): refused")


def list_dir(path: Path) -> list[Path]:
    """The entries of a results directory, each checked by check_regular, sorted by name."""
    check_regular(path)
    entries = sorted(path.iterdir())
    for entry in entries:
        check_regular(entry)
    return entries


def read_json(path: Path) -> dict:
    check_regular(path)
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


def _fingerprint_field(fp: dict, key: str):
    value = fp.get(key)
    if value is None and fp.get("gpu") not in (None, "cpu"):
        return LEGACY_GPU_FIELDS.get(key)
    return value


def fingerprint_differences(fp_a: dict, fp_b: dict) -> list[str]:
    """Fingerprint fields that differ (both known): empty when the runs may be compared."""
    diffs = []
    for key in COMPARABLE_KEYS:
        a, b = _fingerprint_field(fp_a, key), _fingerprint_field(fp_b, key)
        if a is not None and b is not None and a != b:
            diffs.append(f"{key}: {a} -> {b}")
    return diffs


def physical_gpu_change(fp_a: dict, fp_b: dict) -> str | None:
    """A note when two comparable runs were measured on different physical GPUs (both UUIDs known)."""
    a, b = fp_a.get("gpu_uuid"), fp_b.get("gpu_uuid")
    if not a or not b or a == b:
        return None
    return (f"base and head ran on different physical GPUs ({a} -> {b}): boards of one model can differ by "
            "1-2%, so a small first-pass change is only settled by confirmation (base and head on one GPU)")


def load_benchmarks(results_dir: Path) -> dict[str, dict]:
    path = results_dir / "benchmarks.json"
    if not os.path.lexists(path):
        return {}
    data = read_json(path)
    return {k: v for k, v in data.items() if isinstance(v, dict)}


def asv_metric(name: str, benchmarks: dict[str, dict], path: Path) -> metrics.Metric:
    """A benchmark's unit and direction: the project's table for its own benchmarks (benchmarks.json must
    agree), asv's convention (the file's unit, larger is worse) for anyone else's."""
    unit = benchmarks.get(name, {}).get("unit")
    known = metrics.lookup(name)
    if known is not None:
        if unit is not None and unit != known.unit:
            raise DataError(f"{path}: benchmarks.json gives {name} unit {unit!r}, kdengine.bench.metrics "
                            f"says {known.unit!r}")
        return known
    if unit is None:
        method = name.rsplit(".", 1)[-1]
        unit = "seconds" if method.startswith("time_") else "bytes" if method.startswith(("mem_", "peakmem_")) \
            else "unit"
    if not isinstance(unit, str) or not unit:
        raise DataError(f"{path}: benchmark {name} has no usable unit ({unit!r})")
    return metrics.Metric(unit, "lower")


def checked_values(values: list, unit: str, where: str) -> list[float]:
    """The values as floats: finite, and > 0 for the project's times and rates (metrics.UNITS); a
    DataError naming `where` otherwise. Units of other projects only need finite values."""
    try:
        return metrics.check_values(values, unit if unit in metrics.UNITS else "unit", where)
    except ValueError as exc:
        raise DataError(str(exc)) from None


# --- asv result files ----------------------------------------------------------------------------------


def parse_asv_result(path: Path, benchmarks: dict[str, dict], data: dict | None = None
                     ) -> tuple[dict, dict[tuple, tuple[str, Point]]]:
    """One asv v2 result file (its parsed JSON may be given) -> (header, {(asv_name, params): (display
    name, Point)})."""
    data = read_json(path) if data is None else data
    try:
        columns = data["result_columns"]
        rows = data["results"]
        started = []
        header = {"commit": str(data["commit_hash"]), "env": str(data.get("env_name") or ""),
                  "params": data.get("params", {}), "commit_date": float(data.get("date") or 0) / 1000.0}
        points = {}
        for name, row in rows.items():
            metric = asv_metric(name, benchmarks, path)
            cols = dict(zip(columns, row, strict=False))
            if cols.get("started_at"):
                started.append(float(cols["started_at"]) / 1000.0)
            combos = [tuple(c) for c in itertools.product(*(cols.get("params") or []))] or [()]
            values = cols.get("result")
            values = values if isinstance(values, list) else [values]
            samples = cols.get("samples") or [None] * len(values)
            for combo, value, samp in zip(combos, values, samples, strict=True):
                if value is None or (isinstance(value, float) and value != value):
                    continue  # failed or skipped case (asv writes null / NaN)
                where = f"{path}: {asv_key(name, combo)}"
                value = checked_values([value], metric.unit, where)[0]
                samp = checked_values(samp, metric.unit, where) if samp else None
                points[(name, combo)] = (asv_key(name, combo),
                                         Point(value, metric.unit, metric.direction, samp,
                                               version=cols.get("version")))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise DataError(f"malformed asv result file {path}: {exc!r}") from None
    header["started"] = min(started) if started else header["commit_date"]
    return header, points


def apply_sidecar(run: Run, asv_points: dict, sidecar: dict, path: Path) -> None:
    """Add the sidecar's workloads under their stable names (samples, direction, throttling); the asv
    points they came from are dropped so nothing is counted twice."""
    try:
        fp = sidecar.get("fingerprint") or {}
        run.fingerprint.update(fp)
        for workload, res in sidecar["results"].items():
            where = f"{path}: {workload}"
            asv_name = res.get("asv_name")
            metric = metrics.check_entry(asv_name, res.get("unit"), res.get("direction"), where)
            key = (asv_name, tuple(res.get("asv_params") or ()))
            display, point = asv_points.get(key, (None, None))
            if display is not None:
                run.points.pop(display, None)
            samples = metrics.check_values(res.get("samples") or [], metric.unit, where)
            if res.get("median") is not None:
                median = metrics.check_value(res["median"], metric.unit, where)
            elif samples:
                median = statistics.median(samples)
            else:
                raise ValueError(f"{where}: neither a median nor samples")
            run.points[workload] = Point(median, metric.unit, metric.direction, samples or None,
                                         bool(res.get("throttled")), res.get("extra") or {},
                                         point.version if point else None)
        # a run is throttled when every workload was: one throttled workload marks only its own point
        flags = [bool(r.get("throttled")) for r in sidecar["results"].values()]
        run.throttled = run.throttled or (all(flags) if flags else bool(fp.get("throttled")))
    except ValueError as exc:
        raise DataError(str(exc)) from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"malformed samples sidecar {path}: {exc!r}") from None


def name_map(sidecar_docs: list[dict]) -> dict[tuple, str]:
    """{(asv_name, params): workload name} learnt from every sidecar of a machine, so a run without its own
    sidecar is still compared under the stable names."""
    out = {}
    for doc in sidecar_docs:
        for workload, res in doc["results"].items():
            if isinstance(res, dict) and res.get("asv_name"):
                out[(res["asv_name"], tuple(res.get("asv_params") or ()))] = workload
    return out


# --- one machine ---------------------------------------------------------------------------------------


def read_sidecars(results_dir: Path, machine: str) -> list[tuple[Path, dict]]:
    folder = results_dir / "samples" / machine
    if not os.path.lexists(folder):
        return []
    docs = []
    for path in list_dir(folder):
        if path.suffix != ".json" or path.is_dir():
            continue
        try:
            doc = sidecars.check_sidecar(read_json(path), str(path))
        except ValueError as exc:
            raise DataError(str(exc)) from None
        if doc["machine"] != machine:
            raise DataError(f"{path}: sidecar of machine {doc['machine']!r} filed under {machine!r}")
        docs.append((path, doc))
    return docs


def read_asv_files(results_dir: Path, machine: str, benchmarks: dict, hist: MachineHistory) -> list:
    """[(path, header, points)] of the machine's asv files; old-format files are set aside."""
    folder = results_dir / machine
    if not os.path.lexists(folder):
        return []
    out, seen = [], {}
    for path in list_dir(folder):
        if path.suffix != ".json" or path.name == "machine.json" or path.is_dir():
            continue
        data = read_json(path)
        version = data.get("version")
        if version != ASV_RESULT_VERSION:
            commit = str(data.get("commit_hash", ""))
            hist.set_aside[str(path)] = (f"asv result file of an old format (version {version!r}); "
                                         "asv says: run `asv update`")
            if commit:
                hist.old_format_commits[commit] = str(path)
            continue
        header, points = parse_asv_result(path, benchmarks, data)
        key = (header["commit"], header["env"])
        if key in seen:
            raise DataError(f"two asv result files for commit {key[0][:10]} env {key[1]!r} on {machine}: "
                            f"{seen[key]} and {path}")
        seen[key] = path
        out.append((path, header, points))
    return out


def load_machine(results_dir: Path, machine: str, benchmarks: dict | None = None) -> MachineHistory:
    """Every run of one machine, in the order the runs were made."""
    benchmarks = load_benchmarks(results_dir) if benchmarks is None else benchmarks
    hist = MachineHistory(machine, [])
    asv_files = read_asv_files(results_dir, machine, benchmarks, hist)
    docs = read_sidecars(results_dir, machine)
    names = name_map([d for _, d in docs])
    envs_of: dict[str, list[str]] = {}
    for _, header, _ in asv_files:
        envs_of.setdefault(header["commit"], []).append(header["env"])
    by_key: dict[tuple[str, str], list[Run]] = {}
    sidecar_of: dict[int, tuple[Path, dict]] = {}  # id(run) -> its sidecar, applied once points are named
    for path, doc in docs:
        commit, env = str(doc["commit"]), doc.get("env")
        if env is None:  # schema 1: no env recorded; it belongs to the commit's only asv environment
            candidates = envs_of.get(commit, [])
            if len(candidates) > 1:
                raise DataError(f"{path}: records no environment, and commit {commit[:10]} has several "
                                f"({', '.join(candidates)}): cannot tell which run it belongs to")
            env = candidates[0] if candidates else ""
        created = _run_id_epoch(doc.get("run_id")) or _iso_to_epoch(doc.get("date"))
        run = Run(commit, machine, created, env=env, run_id=str(doc.get("run_id") or ""), has_samples=True,
                  paths=[str(path)], branch=doc.get("branch") if isinstance(doc.get("branch"), str) else None)
        sidecar_of[id(run)] = (path, doc)
        by_key.setdefault((commit, env), []).append(run)
    runs = []
    for path, header, points in asv_files:
        key = (header["commit"], header["env"])
        group = sorted(by_key.pop(key, []), key=lambda r: (r.date, r.run_id))
        if not group:  # an asv file without a sidecar: a run of its own
            group = [Run(header["commit"], machine, header["started"], env=header["env"])]
        elif not group[-1].run_id:  # schema 1 sidecar (no run id): asv's start time says when it ran
            group[-1].date = header["started"]
        for key2 in ("cpu", "arch", "machine"):
            for run in group:
                run.fingerprint.setdefault(key2, header["params"].get(key2))
        # the asv file holds the newest run of this commit and env: its asv-only metrics belong there
        newest = group[-1]
        newest.paths.append(str(path))
        for (asv_name, combo), (display, point) in points.items():
            workload = names.get((asv_name, combo))
            if workload is None:
                newest.points[display] = point
            elif not newest.has_samples:
                newest.points[workload] = point  # same name as the sidecar would give it
        runs.extend(group)
    for group in by_key.values():  # sidecars without an asv file
        runs.extend(group)
    points_of = {(h["commit"], h["env"]): p for _, h, p in asv_files}
    for run in runs:
        if id(run) in sidecar_of:
            path, doc = sidecar_of[id(run)]
            apply_sidecar(run, points_of.get((run.commit, run.env), {}), doc, path)
    hist.runs = sorted(runs, key=lambda r: (r.date, r.run_id, r.commit))
    return hist


def load_histories(results_dir: str | Path, machine: str | None = None) -> dict[str, MachineHistory]:
    """{machine: MachineHistory} for every machine directory (or just `machine`)."""
    results_dir = Path(results_dir)
    if not results_dir.is_dir():
        raise DataError(f"results directory {results_dir} does not exist")
    check_regular(results_dir)
    if os.path.lexists(results_dir / RECORD_JOURNAL):
        raise DataError(f"interrupted record in {results_dir}: run `python -m ci record --recover`")
    benchmarks = load_benchmarks(results_dir)
    names = [p.name for p in list_dir(results_dir)
             if p.is_dir() and p.name != "samples" and os.path.lexists(p / "machine.json")]
    sidecar_root = results_dir / "samples"
    if os.path.lexists(sidecar_root):
        names += [p.name for p in list_dir(sidecar_root) if p.is_dir() and p.name not in names]
    if machine is not None:
        names = [n for n in names if n == machine]
    return {name: load_machine(results_dir, name, benchmarks) for name in sorted(names)}


def load_all(results_dir: str | Path, machine: str | None = None) -> dict[str, list[Run]]:
    """{machine: runs in the order they were made} for every machine directory (or just `machine`)."""
    return {name: h.runs for name, h in load_histories(results_dir, machine).items()}


# --- commits -------------------------------------------------------------------------------------------


def resolve_commit(commits: list[str], sha: str, what: str) -> str:
    """The one commit among `commits` that `sha` names (full, or a unique prefix of >= 4 characters).
    DataError naming the argument and the candidates when it names none or several."""
    sha = (sha or "").strip().lower()
    if not sha:
        raise DataError(f"{what}: empty commit")
    if len(sha) < MIN_PREFIX:
        raise DataError(f"{what}: {sha!r} is too short (at least {MIN_PREFIX} characters)")
    matches = sorted({c for c in commits if c.lower().startswith(sha)})
    if not matches:
        raise UnknownCommit(f"{what}: no results for commit {sha}")
    if len(matches) > 1:
        raise DataError(f"{what}: {sha!r} is ambiguous: {', '.join(m[:12] for m in matches)}")
    return matches[0]


def runs_of(runs: list[Run], commit: str) -> list[Run]:
    return [r for r in runs if r.commit == commit]


def find_run(runs: list[Run], sha: str) -> Run | None:
    """The newest run of the commit `sha` names, or None when it names no commit with results (an ambiguous
    prefix is a DataError)."""
    try:
        commit = resolve_commit([r.commit for r in runs], sha, "commit")
    except UnknownCommit:
        return None
    return runs_of(runs, commit)[-1]


def first_parent_order(repo: str, tip: str) -> dict[str, int] | None:
    """{sha: position} along the first-parent chain ending at `tip` (oldest = 0), or None without git."""
    import subprocess

    try:
        out = subprocess.run(["git", "-C", repo, "rev-list", "--first-parent", tip], capture_output=True,
                             text=True, check=True, timeout=30).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return {sha: i for i, sha in enumerate(reversed(out))}


def match_pattern(name: str, patterns: dict):
    """The value of the most specific glob pattern matching `name` (exact name first, then longest)."""
    if name in patterns:
        return patterns[name]
    hits = [p for p in patterns if fnmatch.fnmatchcase(name, p)]
    return patterns[max(hits, key=len)] if hits else None


def _run_id_epoch(run_id: str | None) -> float:
    from datetime import datetime, timezone

    if not run_id:
        return 0.0
    try:
        return datetime.strptime(run_id[:16], "%Y%m%dT%H%M%SZ").replace(tzinfo=timezone.utc).timestamp()
    except ValueError:
        return 0.0


def _iso_to_epoch(text: str | None) -> float:
    from datetime import datetime

    if not text:
        return 0.0
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return 0.0
