"""The regression gate: compare a head commit with a base commit (and the base branch's history) per benchmark
and machine. A benchmark regressed when it got worse in its own direction, the change is significant
(one-sided Mann-Whitney U on samples; the history's spread where there are no samples) and it can reach the
threshold (default 5%, overrides in ci/thresholds.toml), or when the newest point starts a worse step found by
E-divisive change-point detection (Apache Otava) over the history. Exit: 0 nothing regressed, 1 a regression,
2 usage or data error. Runs with different fingerprints (GPU, driver, CUDA, torch) are never compared.
"""

from __future__ import annotations

import math
import statistics
import subprocess
from dataclasses import asdict, dataclass, field
from pathlib import Path

from scipy import stats

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ci import history
from ci.history import DataError, Point, Run

THRESHOLDS_FILE = Path(__file__).with_name("thresholds.toml")
DEFAULTS = {"threshold": 0.05, "alpha": 0.01, "pool": 5, "window": 300, "sparkline": 20, "min_samples": 5}
Z_MARGIN = 2.3263  # one-sided 99%: a true change at the threshold is caught 99% of the time
MEDIAN_SE = 1.2533 * 1.4826  # standard error of a median from the MAD, for normal-ish noise


@dataclass
class Verdict:
    name: str
    machine: str
    verdict: str  # regressed / improved / unchanged / noisy / new / missing
    unit: str = ""
    direction: str = "lower"
    base: float | None = None
    head: float | None = None
    change: float | None = None  # relative change head vs base (signed, raw)
    worse: float | None = None  # relative change in the bad direction (> 0 = worse)
    p_value: float | None = None
    baseline: float | None = None  # pooled median of the base segment (base + earlier runs, same step)
    threshold: float = 0.05
    reason: str = ""
    history: list[float] = field(default_factory=list)
    change_points: list[dict] = field(default_factory=list)


# --- configuration -------------------------------------------------------------------------------------


def load_thresholds(path: str | Path | None = None) -> dict:
    """{"defaults": {...}, "thresholds": {glob: fraction}} from the reviewed TOML file (missing = defaults)."""
    path = Path(path) if path else THRESHOLDS_FILE
    data = {}
    if path.exists():
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    defaults = {**DEFAULTS, **data.get("defaults", {})}
    return {"defaults": defaults, "thresholds": dict(data.get("thresholds", {}))}


def threshold_for(name: str, config: dict) -> float:
    value = history.match_pattern(name, config["thresholds"])
    return float(value if value is not None else config["defaults"]["threshold"])


# --- statistics ----------------------------------------------------------------------------------------


def worse_fraction(base: float, head: float, direction: str) -> float:
    """Relative change in the bad direction: +0.1 = 10% worse, whatever the unit's direction."""
    change = (head - base) / abs(base) if base else 0.0
    return change if direction == "lower" else -change


def mad_se(values: list[float]) -> float:
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    return MEDIAN_SE * mad / math.sqrt(len(values))


def test_samples(base: list[float], head: list[float], direction: str) -> tuple[float, float, float]:
    """(p that head is worse, p that head is better, one-sided 95% margin on the relative change)."""
    worse_alt = "greater" if direction == "lower" else "less"
    better_alt = "less" if direction == "lower" else "greater"
    p_worse = float(stats.mannwhitneyu(head, base, alternative=worse_alt).pvalue)
    p_better = float(stats.mannwhitneyu(head, base, alternative=better_alt).pvalue)
    ref = abs(statistics.median(base)) or 1.0
    margin = Z_MARGIN * math.hypot(mad_se(base), mad_se(head)) / ref
    return p_worse, p_better, margin


def test_history(values: list[float], worse: float) -> tuple[float, float, float] | None:
    """Without samples: z-test of the change against the history's relative spread (>= 3 points)."""
    if len(values) < 3:
        return None
    ref = abs(statistics.median(values)) or 1.0
    spread = 1.4826 * statistics.median(abs(v - statistics.median(values)) for v in values) / ref
    spread = spread or statistics.pstdev(values) / ref
    if spread == 0:
        return (0.0, 1.0, 0.0) if worse > 0 else ((1.0, 0.0, 0.0) if worse < 0 else (1.0, 1.0, 0.0))
    z = worse / (spread * math.sqrt(1 + 1 / len(values)))
    return float(stats.norm.sf(z)), float(stats.norm.cdf(z)), Z_MARGIN * spread


def change_points(values: list[float], alpha: float) -> list[int]:
    """Indices where a new segment starts (E-divisive + Hunter merge step, Apache Otava)."""
    if len(values) < 4:
        return []
    from otava.analysis import compute_change_points

    cps, _ = compute_change_points(values, window_len=50, max_pvalue=min(alpha, 0.001))
    return [int(cp.index) for cp in cps]


def decide(worse: float, p_worse: float | None, p_better: float | None, margin: float, thr: float,
           alpha: float) -> tuple[str, str]:
    if p_worse is None:  # no samples and < 3 history points: significance cannot be judged
        if abs(worse) >= thr:
            return "noisy", f"beyond {thr:.0%} but no samples and < 3 history points to judge it"
        return "unchanged", ""
    if worse > 0 and p_worse < alpha and worse + margin >= thr:
        return "regressed", f"significant (p={p_worse:.2g}) and can reach the {thr:.0%} threshold"
    if worse < 0 and p_better < alpha and -worse + margin >= thr:
        return "improved", f"significant (p={p_better:.2g}): refresh the baseline on purpose"
    if abs(worse) >= thr:
        return "noisy", f"beyond {thr:.0%} but not significant at alpha={alpha}"
    return "unchanged", ""


# --- per benchmark -------------------------------------------------------------------------------------


def base_segment(name: str, hist: list[Run], cps: list[int], pool: int) -> list[Point]:
    """The base point and up to pool-1 earlier points after the last change point (same benchmark)."""
    pts = [r.points[name] for r in hist if name in r.points and not r.points[name].throttled]
    start = max([c for c in cps if c < len(pts)] or [0])
    return pts[max(start, len(pts) - pool):]


def judge(name: str, machine: str, base_run: Run, head_pt: Point, hist: list[Run], config: dict) -> Verdict:
    d = config["defaults"]
    thr, alpha = threshold_for(name, config), float(d["alpha"])
    series = [r.points[name].value for r in hist if name in r.points and not r.points[name].throttled]
    series = series[-int(d["window"]):]
    full = series + [head_pt.value]
    cps = change_points(full, alpha)
    base_pt = base_run.points[name]
    worse = worse_fraction(base_pt.value, head_pt.value, head_pt.direction)
    v = Verdict(name, machine, "unchanged", head_pt.unit, head_pt.direction, base_pt.value, head_pt.value,
                (head_pt.value - base_pt.value) / abs(base_pt.value) if base_pt.value else 0.0, worse,
                threshold=thr, history=full[-int(d["sparkline"]):])
    offset = len(hist) - len(series)
    v.change_points = [{"index": i, "commit": (hist[offset + i].commit if i < len(series) else "head"),
                        "before": statistics.fmean(full[max(0, i - 5):i]), "after": full[i]} for i in cps]
    pooled = base_segment(name, hist, [c for c in cps if c < len(series)], int(d["pool"]))
    base_samples = [s for p in pooled for s in (p.samples or [])]
    if head_pt.samples and len(head_pt.samples) >= d["min_samples"] and len(base_samples) >= d["min_samples"]:
        p_worse, p_better, margin = test_samples(base_samples, head_pt.samples, head_pt.direction)
        v.baseline = statistics.median(base_samples)  # the base segment's pooled median decides
        head_median = statistics.median(head_pt.samples)
        worse = v.worse = worse_fraction(v.baseline, head_median, head_pt.direction)
        v.change = (head_median - v.baseline) / abs(v.baseline) if v.baseline else 0.0
        v.base, v.head = v.baseline, head_median
    else:
        seg = [p.value for p in pooled] if len(pooled) >= 3 else series[-int(d["pool"]) * 4:]
        got = test_history(seg, worse)
        p_worse, p_better, margin = got if got else (None, None, 0.0)
    v.verdict, v.reason = decide(worse, p_worse, p_better, margin, thr, alpha)
    if len(pooled) > 1 and v.reason:
        v.reason += f"; baseline = median of {len(pooled)} runs since the last change point"
    v.p_value = p_worse if worse >= 0 else p_better
    if len(series) in cps and worse >= thr and v.verdict != "regressed":
        v.verdict, v.reason = "regressed", "the newest point starts a step (E-divisive change point)"
    if head_pt.throttled and v.verdict == "regressed":
        v.verdict, v.reason = "noisy", "head run was throttled: rerun before trusting it"
    return v


# --- per machine and overall ---------------------------------------------------------------------------


def base_branch(runs: list[Run], base: Run, repo: str | None) -> list[Run]:
    """Runs on the base branch up to and including base, oldest first (first-parent order when a repo
    is given, else by commit date)."""
    if repo:
        try:
            out = subprocess.run(["git", "-C", repo, "rev-list", "--first-parent", base.commit],
                                 capture_output=True, text=True, check=True, timeout=30).stdout.split()
            order = {sha: i for i, sha in enumerate(reversed(out))}
            return sorted((r for r in runs if r.commit in order), key=lambda r: order[r.commit])
        except (OSError, subprocess.SubprocessError):
            pass
    return [r for r in runs if (r.date, r.commit) <= (base.date, base.commit)]


def pick_base(hist: list[Run], base: Run) -> tuple[Run | None, str]:
    """The base run, or the nearest earlier unthrottled comparable one when base was throttled."""
    if not base.throttled:
        return base, ""
    for run in reversed(hist):
        if not run.throttled and not history.comparable(run.fingerprint, base.fingerprint):
            return run, f"base {base.commit[:8]} was throttled: refused; compared with {run.commit[:8]}"
    return None, f"base {base.commit[:8]} was throttled and no unthrottled baseline exists"


def gate_machine(machine: str, runs: list[Run], base_sha: str, head_sha: str, config: dict,
                 repo: str | None = None) -> dict:
    head = history.find_run(runs, head_sha)
    base = history.find_run(runs, base_sha)
    out = {"machine": machine, "base": base.commit if base else base_sha,
           "head": head.commit if head else head_sha, "notes": [], "benchmarks": []}
    if head is None:
        out["notes"].append(f"no results for head {head_sha[:8]} on {machine}")
        return out
    if base is None:
        out["notes"].append(f"no results for base {base_sha[:8]} on {machine}: every benchmark is new")
        out["benchmarks"] = [asdict(Verdict(n, machine, "new", p.unit, p.direction, head=p.value))
                             for n, p in sorted(head.points.items())]
        return out
    diffs = history.comparable(base.fingerprint, head.fingerprint)
    if diffs:
        out["notes"].append("fingerprint mismatch, not compared: " + "; ".join(diffs))
        out["fingerprint_mismatch"] = diffs
        out["benchmarks"] = [asdict(Verdict(n, machine, "new", p.unit, p.direction, head=p.value,
                                            reason="other fingerprint"))
                             for n, p in sorted(head.points.items())]
        return out
    hist = [r for r in base_branch(runs, base, repo) if r.commit != head.commit
            and not history.comparable(r.fingerprint, head.fingerprint) and not r.throttled]
    base_run, note = pick_base(hist, base)
    if note:
        out["notes"].append(note)
    for name in sorted(set(head.points) | set(base.points)):
        if name not in head.points:
            out["benchmarks"].append(asdict(Verdict(name, machine, "missing", base.points[name].unit,
                                                    base.points[name].direction, base=base.points[name].value)))
        elif base_run is None or name not in base_run.points:
            p = head.points[name]
            out["benchmarks"].append(asdict(Verdict(name, machine, "new", p.unit, p.direction, head=p.value)))
        else:
            upto = [r for r in hist if (r.date, r.commit) <= (base_run.date, base_run.commit)] or [base_run]
            out["benchmarks"].append(asdict(judge(name, machine, base_run, head.points[name], upto, config)))
    return out


def run_gate(results_dir: str, base: str, head: str, machine: str | None = None,
             thresholds: str | None = None, repo: str | None = None, pool: int | None = None) -> dict:
    """pool: how many base-branch runs (base included) form the baseline; 1 = the base run only
    (interleaved measurements, where earlier runs were not measured alongside the head)."""
    config = load_thresholds(thresholds)
    if pool is not None:
        if pool < 1:
            raise ValueError(f"--pool: expected >= 1, got {pool}")
        config["defaults"]["pool"] = pool
    machines = history.load_all(results_dir, machine)
    if machine is not None and machine not in machines:
        raise DataError(f"--machine: no results for machine {machine!r} in {results_dir}")
    reports = [gate_machine(m, runs, base, head, config, repo) for m, runs in machines.items()
               if history.find_run(runs, head) or machine]
    if not reports:
        raise DataError(f"--head: no results for commit {head} in {results_dir}")
    rows = [b for r in reports for b in r["benchmarks"]]
    regressed = [b["name"] for b in rows if b["verdict"] == "regressed"]
    return {"base": base, "head": head, "machines": reports, "benchmarks": rows,
            "regressed": regressed, "exit_code": 1 if regressed else 0,
            "counts": {v: sum(b["verdict"] == v for b in rows) for v in
                       ("regressed", "improved", "unchanged", "noisy", "new", "missing")}}


def add_parser(sub) -> None:
    p = sub.add_parser("gate", help="compare head with base and history; exit 1 on a regression")
    p.add_argument("--results-dir", default="perf_history")
    p.add_argument("--base", required=True, help="base commit (full or abbreviated sha)")
    p.add_argument("--head", required=True, help="head commit")
    p.add_argument("--machine", default=None)
    p.add_argument("--thresholds", default=None, help="thresholds TOML (default ci/thresholds.toml)")
    p.add_argument("--repo", default=None, help="git repo for first-parent base-branch order")
    p.add_argument("--pool", type=int, default=None, help="runs in the baseline (default 5; 1 = base only)")
    p.add_argument("--json", default=None, help="write the verdicts as JSON here")
    p.add_argument("--markdown", default=None, help="write the markdown report here")
    p.set_defaults(func=main)


def main(args) -> int:
    from ci import report

    result = run_gate(args.results_dir, args.base, args.head, args.machine, args.thresholds, args.repo,
                      args.pool)
    report.write_outputs(result, args.json, args.markdown)
    print(report.render_markdown(result))
    return result["exit_code"]

