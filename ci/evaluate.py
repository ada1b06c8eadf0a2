"""Judge the regression gate on a real asv history, side by side with `asv compare --factor F`.

`python -m ci evaluate --results-dir DIR --machine M` replays the machine's history run by run, in the order
the runs were made (earliest `started_at` in each run's asv files; `--order date` uses the commit date the
gate's loader sorts by), and for every consecutive pair (base = previous run, head = this run):
- asks the gate, in memory: ci.gate.gate_machine(machine, runs up to and including head, base, head,
  ci.gate.load_thresholds(), repo=None); a pair fails when any benchmark is "regressed";
- asks asv: asv.commands.compare.Compare.print_table(..., factor=F, use_stats=True) on the same two runs'
  result files (loaded with asv.results.Results.load), and reads each benchmark's mark from asv's own table
  ("+" worse, "!" newly failing = red, as `asv continuous` fails on them). Nothing of asv's rule is
  re-implemented here.

Figures (per machine and overall):
- pairs failing: share of pairs with any red benchmark, gate vs asv;
- flags not persisting: a (pair, benchmark) flag whose next run is back within the threshold of the base
  value (worse by < threshold), over flags that have a next run;
- spikes and steps are looked for within one benchmark version (a changed `version` starts a new series);
- one-run slow spikes: run i worse by >= threshold than both neighbours (i-1 and i+1), with i+1 back within
  the threshold of i-1; how many of them each turned red;
- persistent steps (robust before/after medians): at run i, the median of the `--step-runs` N runs after
  (i..i+N-1) is worse by >= threshold than the median of the N runs before (i-N..i-1), every one of the N
  runs after is worse than the before-median by >= threshold/2, and run i-1 was not already such a start;
  "caught" = red at pair (i-1, i); "re-flagged" = red again on a later pair (j-1, j), i < j < i+N, whose
  head is within the threshold of its base (an innocent commit);
- timing of the gate's replay (total, mean and max per pair) and of asv's.
The threshold is the gate's own per-benchmark threshold (ci/thresholds.toml), and asv's factor - 1 for asv.
Also reported: what is odd in the data (several env files per commit, changed benchmark versions,
benchmarks appearing or disappearing, commit dates out of the order the runs were made, old-format files).
Exit 0; 2 on a usage or data error.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import statistics
import time
import types
from pathlib import Path

from ci import gate, history
from ci.history import DataError

RED_MARKS = ("+", "!")


# --- loading --------------------------------------------------------------------------------------------


def run_started(run) -> float:
    """When the run was made: the earliest started_at (ms) in its asv files, else its commit date."""
    best = None
    for path in run.paths:
        try:
            data = json.loads(Path(path).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        cols = data.get("result_columns") or []
        if "started_at" not in cols:
            continue
        k = cols.index("started_at")
        for row in (data.get("results") or {}).values():
            if isinstance(row, list) and len(row) > k and isinstance(row[k], (int, float)):
                best = row[k] / 1000.0 if best is None else min(best, row[k] / 1000.0)
    return run.date if best is None else best


def ordered_runs(runs: list, order: str) -> list:
    if order == "date":
        return list(runs)
    return sorted(runs, key=lambda r: (run_started(r), r.commit))


def asv_files(run) -> list[str]:
    """The run's asv result files (not samples sidecars)."""
    return [p for p in run.paths if Path(p).parent.parent.name != "samples" and Path(p).name != "machine.json"]


def data_notes(results_dir: Path, machine: str, runs: list) -> dict:
    """What is odd in the history: the gate must cope with each of these."""
    notes = {"runs_with_several_files": [], "version_changes": [], "appeared": [], "disappeared": [],
             "dates_out_of_run_order": 0, "old_format_files": []}
    for path in sorted((results_dir / machine).glob("*.json")):
        if path.name == "machine.json":
            continue
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            notes["old_format_files"].append(path.name + " (unreadable)")
            continue
        if data.get("version") != 2 or "result_columns" not in data:
            notes["old_format_files"].append(path.name)
    prev_versions: dict[str, str] = {}
    prev_names: set[str] | None = None
    for i, run in enumerate(runs):
        files = asv_files(run)
        if len(files) > 1:
            notes["runs_with_several_files"].append({"commit": run.commit, "files": [Path(f).name for f in files]})
        versions = {}
        for f in files:
            try:
                data = json.loads(Path(f).read_text(encoding="utf-8"))
                cols = data["result_columns"]
                k = cols.index("version")
                versions.update({name: row[k] for name, row in data["results"].items()})
            except (OSError, ValueError, KeyError, IndexError, TypeError):
                continue
        for name, ver in versions.items():
            if name in prev_versions and prev_versions[name] != ver:
                notes["version_changes"].append({"benchmark": name, "commit": run.commit})
        prev_versions.update(versions)
        names = set(versions)
        if prev_names is not None:
            notes["appeared"] += [{"benchmark": n, "commit": run.commit} for n in sorted(names - prev_names)]
            notes["disappeared"] += [{"benchmark": n, "commit": run.commit} for n in sorted(prev_names - names)]
        prev_names = names
        if i and run.date < runs[i - 1].date:
            notes["dates_out_of_run_order"] += 1
    return notes


# --- the two judges ------------------------------------------------------------------------------------


def gate_pair(machine: str, upto: list, base, head, config: dict) -> dict[str, str]:
    out = gate.gate_machine(machine, upto, base.commit, head.commit, config, repo=None)
    return {b["name"]: b["verdict"] for b in out["benchmarks"]}


def _asv_resultset(paths: list[str]):
    from asv.results import Results

    for path in paths:
        result = Results.load(path)
        for key in result.get_all_result_keys():
            params = result.get_result_params(key)
            yield (key, params, result.get_result_value(key, params), result.get_result_stats(key, params),
                   result.get_result_samples(key, params), result.benchmark_version.get(key),
                   result.params["machine"], result.env_name)


def asv_pair(results_dir: Path, base, head, factor: float) -> dict[str, str]:
    """{benchmark display name: asv's mark} from asv compare's own table for this pair."""
    from asv.commands import compare as asv_compare
    from asv.commands.compare import Compare

    conf = types.SimpleNamespace(results_dir=str(results_dir), benchmark_dir=str(results_dir))
    buf = io.StringIO()
    real_get_err = asv_compare.get_err

    def get_err(value, stats):  # display only (the +- column); extracts without quartiles show none
        try:
            return real_get_err(value, stats)
        except KeyError:
            return None

    asv_compare.get_err = get_err
    with contextlib.redirect_stdout(buf), _restore(asv_compare, "get_err", real_get_err):
        Compare.print_table(conf, base.commit, head.commit, factor=factor, split=False,
                            resultset_1=_asv_resultset(asv_files(base)),
                            resultset_2=_asv_resultset(asv_files(head)), only_changed=False, sort="default",
                            use_stats=True)
    marks = {}
    for line in buf.getvalue().splitlines():
        if not line.startswith("|"):
            continue
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 5 or cells[0] == "Change" or set(cells[0]) <= set("-:") and cells[0]:
            continue
        marks[cells[-1]] = cells[0]
    return marks


@contextlib.contextmanager
def _restore(module, attr, value):
    try:
        yield
    finally:
        setattr(module, attr, value)


# --- figures -------------------------------------------------------------------------------------------


def worse(base: float, head: float) -> float:
    return gate.worse_fraction(base, head, "lower")


def series_of(runs: list, name: str) -> list[float | None]:
    return [r.points[name].value if name in r.points else None for r in runs]


def direction_of(runs: list, name: str) -> str:
    for r in runs:
        if name in r.points:
            return r.points[name].direction
    return "lower"


def run_versions(run) -> dict[str, str]:
    """{asv benchmark name: version} over the run's asv files."""
    out = {}
    for f in asv_files(run):
        try:
            data = json.loads(Path(f).read_text(encoding="utf-8"))
            k = data["result_columns"].index("version")
            out.update({name: row[k] for name, row in data["results"].items()})
        except (OSError, ValueError, KeyError, IndexError, TypeError, AttributeError):
            continue
    return out


def _same(segs: list | None, idx) -> bool:
    return segs is None or len({segs[j] for j in idx}) == 1


def find_spikes(vals: list, thr: float, direction: str, segs: list | None = None) -> list[int]:
    """segs: a series id per run (the benchmark version): a spike never spans two versions."""
    out = []
    for i in range(1, len(vals) - 1):
        a, b, c = vals[i - 1], vals[i], vals[i + 1]
        if None in (a, b, c) or not _same(segs, (i - 1, i, i + 1)):
            continue
        if (gate.worse_fraction(a, b, direction) >= thr and gate.worse_fraction(c, b, direction) >= thr
                and abs(gate.worse_fraction(a, c, direction)) < thr):
            out.append(i)
    return out


def find_steps(vals: list, thr: float, direction: str, n: int, segs: list | None = None) -> list[int]:
    """segs: as for find_spikes; a version change is not a step."""
    out = []
    prev = False
    for i in range(n, len(vals) - n + 1):
        before, after = vals[i - n:i], vals[i:i + n]
        if None in before or None in after or not _same(segs, range(i - n, i + n)):
            prev = False
            continue
        ref = statistics.median(before)
        hit = (gate.worse_fraction(ref, statistics.median(after), direction) >= thr
               and all(gate.worse_fraction(ref, v, direction) >= thr / 2 for v in after))
        if hit and not prev:
            out.append(i)
        prev = hit
    return out


def evaluate_machine(results_dir: Path, machine: str, runs: list, config: dict, factor: float,
                     step_runs: int) -> dict:
    n = len(runs)
    gate_v: list[dict[str, str]] = [{} for _ in range(n)]  # index = head run
    asv_v: list[dict[str, str]] = [{} for _ in range(n)]
    gate_times, asv_times = [], []
    for i in range(1, n):
        t0 = time.perf_counter()
        gate_v[i] = gate_pair(machine, runs[:i + 1], runs[i - 1], runs[i], config)
        gate_times.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        asv_v[i] = asv_pair(results_dir, runs[i - 1], runs[i], factor)
        asv_times.append(time.perf_counter() - t0)
    names = sorted({k for r in runs for k in r.points})
    versions = [run_versions(r) for r in runs]
    gate_red = [{k for k, v in gate_v[i].items() if v == "regressed"} for i in range(n)]
    asv_red = [{k for k, v in asv_v[i].items() if v in RED_MARKS} for i in range(n)]
    judged = {"gate": sum(1 for i in range(1, n) if gate_v[i]), "asv": sum(1 for i in range(1, n) if asv_v[i])}
    fig = {"machine": machine, "runs": n, "pairs": n - 1, "benchmarks": len(names), "pairs_judged": judged,
           "verdicts": {}, "asv_marks": {}}
    for i in range(1, n):
        for v in gate_v[i].values():
            fig["verdicts"][v] = fig["verdicts"].get(v, 0) + 1
        for m in asv_v[i].values():
            key = m or " "
            fig["asv_marks"][key] = fig["asv_marks"].get(key, 0) + 1
    across = [(i, k) for i in range(1, n) for k, m in asv_v[i].items() if m == "x"]
    fig["version_changed_points"] = {"asv_not_comparable": len(across), "gate_compared_anyway": sum(
        1 for i, k in across if gate_v[i].get(k) in ("regressed", "improved", "unchanged", "noisy"))}
    fig["pairs_failing"] = {"gate": sum(1 for i in range(1, n) if gate_red[i]),
                            "asv": sum(1 for i in range(1, n) if asv_red[i])}
    flags = {"gate": [0, 0], "asv": [0, 0]}  # [flags with a next run, of which not persisting]
    spikes = {"count": 0, "gate": 0, "asv": 0}
    steps = {"count": 0, "gate_caught": 0, "asv_caught": 0, "gate_reflagged_steps": 0, "asv_reflagged_steps": 0,
             "gate_reflags": 0, "asv_reflags": 0, "definition": f"median of {step_runs} runs after vs "
             f"{step_runs} before worse by >= threshold, each run after worse by >= threshold/2"}
    for name in names:
        vals = series_of(runs, name)
        direction = direction_of(runs, name)
        thr_gate = gate.threshold_for(name, config)
        segs = [v.get(name.split("(", 1)[0]) for v in versions]
        for who, red, thr in (("gate", gate_red, thr_gate), ("asv", asv_red, factor - 1.0)):
            for i in range(1, n - 1):
                if name in red[i] and None not in (vals[i - 1], vals[i + 1]):
                    flags[who][0] += 1
                    if gate.worse_fraction(vals[i - 1], vals[i + 1], direction) < thr:
                        flags[who][1] += 1
        for i in find_spikes(vals, thr_gate, direction, segs):
            spikes["count"] += 1
            spikes["gate"] += name in gate_red[i]
            spikes["asv"] += name in asv_red[i]
        for i in find_steps(vals, thr_gate, direction, step_runs, segs):
            steps["count"] += 1
            steps["gate_caught"] += name in gate_red[i]
            steps["asv_caught"] += name in asv_red[i]
            for who, red in (("gate", gate_red), ("asv", asv_red)):
                re = [j for j in range(i + 1, min(i + step_runs, n)) if name in red[j]
                      and None not in (vals[j - 1], vals[j])
                      and abs(gate.worse_fraction(vals[j - 1], vals[j], direction)) < thr_gate]
                steps[f"{who}_reflags"] += len(re)
                steps[f"{who}_reflagged_steps"] += bool(re)
    fig["flags"] = {who: {"with_next_run": a, "not_persisting": b} for who, (a, b) in flags.items()}
    fig["spikes"] = spikes
    fig["steps"] = steps
    fig["timing_s"] = {"gate_total": sum(gate_times), "gate_mean_pair": _mean(gate_times),
                       "gate_max_pair": max(gate_times, default=0.0), "asv_total": sum(asv_times),
                       "asv_mean_pair": _mean(asv_times)}
    fig["per_pair"] = [{"base": runs[i - 1].commit, "head": runs[i].commit, "gate_red": sorted(gate_red[i]),
                        "asv_red": sorted(asv_red[i])} for i in range(1, n)]
    fig["data_notes"] = data_notes(results_dir, machine, runs)
    return fig


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def evaluate(results_dir: str | Path, machine: str | None = None, factor: float = 1.05, step_runs: int = 3,
             order: str = "made", first: int | None = None, last: int | None = None,
             thresholds: str | None = None) -> dict:
    """The figures for every machine (or one); `first`/`last` keep a slice of each machine's runs."""
    results_dir = Path(results_dir)
    if factor <= 1.0:
        raise ValueError(f"--factor: expected > 1, got {factor}")
    if step_runs < 2:
        raise ValueError(f"--step-runs: expected >= 2, got {step_runs}")
    config = gate.load_thresholds(thresholds)
    machines = history.load_all(results_dir, machine)
    if machine is not None and machine not in machines:
        raise DataError(f"--machine: no results for machine {machine!r} in {results_dir}")
    out = {"results_dir": str(results_dir), "factor": factor, "order": order, "machines": []}
    for name, runs in machines.items():
        runs = ordered_runs(runs, order)
        if first is not None:
            runs = runs[:first]
        if last is not None:
            runs = runs[-last:]
        if len(runs) < 2:
            continue
        out["machines"].append(evaluate_machine(results_dir, name, runs, config, factor, step_runs))
    out["total"] = _totals(out["machines"])
    return out


def _totals(figs: list[dict]) -> dict:
    def s(path):
        total = 0
        for f in figs:
            v = f
            for k in path:
                v = v[k]
            total += v
        return total

    pairs = s(["pairs"])
    t = {"pairs": pairs, "runs": s(["runs"])}
    for who in ("gate", "asv"):
        fail = s(["pairs_failing", who])
        t[f"{who}_pairs_failing"] = fail
        t[f"{who}_pairs_failing_share"] = fail / pairs if pairs else 0.0
        nxt, notp = s(["flags", who, "with_next_run"]), s(["flags", who, "not_persisting"])
        t[f"{who}_flags_not_persisting_share"] = notp / nxt if nxt else 0.0
        t[f"{who}_flags_with_next_run"] = nxt
    t["spikes"] = s(["spikes", "count"])
    t["gate_spikes_red"], t["asv_spikes_red"] = s(["spikes", "gate"]), s(["spikes", "asv"])
    t["steps"] = s(["steps", "count"])
    for k in ("gate_caught", "asv_caught", "gate_reflagged_steps", "asv_reflagged_steps"):
        t[f"steps_{k}"] = s(["steps", k])
    t["gate_seconds"] = s(["timing_s", "gate_total"])
    t["asv_seconds"] = s(["timing_s", "asv_total"])
    return t


def render(result: dict) -> str:
    t = result["total"]

    def pct(a, b):
        return f"{a}/{b} ({100.0 * a / b:.0f}%)" if b else f"{a}/0"

    rows = [("", "gate", f"asv compare --factor {result['factor']}"),
            ("pairs failing (any red)", pct(t["gate_pairs_failing"], t["pairs"]), pct(t["asv_pairs_failing"], t["pairs"])),
            ("flags not persisting", f"{100 * t['gate_flags_not_persisting_share']:.0f}% of {t['gate_flags_with_next_run']}",
             f"{100 * t['asv_flags_not_persisting_share']:.0f}% of {t['asv_flags_with_next_run']}"),
            ("one-run spikes turned red", pct(t["gate_spikes_red"], t["spikes"]), pct(t["asv_spikes_red"], t["spikes"])),
            ("persistent steps caught", pct(t["steps_gate_caught"], t["steps"]), pct(t["steps_asv_caught"], t["steps"])),
            ("steps re-flagged later", pct(t["steps_gate_reflagged_steps"], t["steps"]),
             pct(t["steps_asv_reflagged_steps"], t["steps"])),
            ("replay time", f"{t['gate_seconds']:.2f} s", f"{t['asv_seconds']:.2f} s")]
    w = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [f"evaluate: {result['results_dir']}, {t['runs']} runs, {t['pairs']} pairs, order: {result['order']}"]
    lines.append("| " + " | ".join(r.ljust(w[i]) for i, r in enumerate(rows[0])) + " |")
    lines.append("|" + "|".join("-" * (x + 2) for x in w) + "|")
    lines += ["| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |" for r in rows[1:]]
    for f in result["machines"]:
        tm = f["timing_s"]
        d = f["data_notes"]
        lines.append(f"{f['machine']}: {f['runs']} runs x {f['benchmarks']} benchmarks; gate per pair mean "
                     f"{tm['gate_mean_pair']:.3f} s, max {tm['gate_max_pair']:.3f} s; verdicts {f['verdicts']}; "
                     f"asv marks {f['asv_marks']}")
        vc = f["version_changed_points"]
        lines.append(f"  changed benchmark version: asv 'not comparable' on {vc['asv_not_comparable']} points; the gate "
                     f"compared {vc['gate_compared_anyway']} of them anyway")
        lines.append(f"  data: {len(d['runs_with_several_files'])} runs with several env files, "
                     f"{len(d['version_changes'])} version changes, {len(d['appeared'])} benchmarks appearing, "
                     f"{len(d['disappeared'])} disappearing, {d['dates_out_of_run_order']} commit dates out of "
                     f"run order, {len(d['old_format_files'])} old-format files")
    return "\n".join(lines)


def _strict(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _strict(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_strict(v) for v in obj]
    return obj


def add_parser(sub) -> None:
    p = sub.add_parser("evaluate", help="replay a real asv history through the gate and asv compare")
    p.add_argument("--results-dir", default="perf_history")
    p.add_argument("--machine", default=None)
    p.add_argument("--factor", type=float, default=1.05, help="asv compare --factor (default 1.05)")
    p.add_argument("--step-runs", type=int, default=3, help="runs before/after that define a step (default 3)")
    p.add_argument("--order", choices=("made", "date"), default="made",
                   help="replay order: when the runs were made (default) or commit date")
    p.add_argument("--first", type=int, default=None, help="keep only the first N runs of each machine")
    p.add_argument("--last", type=int, default=None, help="keep only the last N runs of each machine")
    p.add_argument("--thresholds", default=None)
    p.add_argument("--json", default=None, help="write the figures here (strict JSON)")
    p.set_defaults(func=main)


def main(args) -> int:
    result = evaluate(args.results_dir, args.machine, args.factor, args.step_runs, args.order, args.first,
                      args.last, args.thresholds)
    if args.json:
        Path(args.json).write_text(json.dumps(_strict(result), indent=1, allow_nan=False) + "\n")
    print(render(result))
    return 0
