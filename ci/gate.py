"""The regression gate: judge a head run against its base and the base branch's history, per benchmark, machine and
environment, with the noise model of ci/noise.py.

For each benchmark the head run is compared with a prediction interval for a new run of unchanged code: the
current level (the runs since the last change point, the base run included) and the run-to-run spread (residuals
of run medians, same-commit reruns, the machine's calibrated prior). "regressed" needs the change to be both
beyond that margin and past the benchmark's floor of practical significance (ci/thresholds.toml). A change past
the floor that the noise cannot settle is "noisy": `ci perf` re-measures it (base and head interleaved) and only a
confirmed regression turns the build red. A slowdown that a commit being judged names as an intended trade (a
`Perf-Accepted:` trailer, within its bound: ci/accept.py) is "accepted" instead. Verdicts: regressed / accepted /
improved / unchanged / noisy / new / missing. Exit: 0 nothing regressed, 1 a regression, 2 usage or data error (a
file, an unknown or ambiguous commit is named), 3 amber: no confirmed regression, but a slowdown that the
confirmation rounds could neither confirm nor dismiss (still past the floor after every round: the machine was too
noisy to decide; `unsettled`). Runs with other fingerprints (GPU, driver, CUDA, torch, the KDENGINE_* overrides
that change what is measured) or environments are never compared; a changed benchmark version starts a new series.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib

from ci import accept, history, noise
from ci.history import DataError, MachineHistory, Run

THRESHOLDS_FILE = Path(__file__).with_name("thresholds.toml")
PRIOR_FILE = Path(__file__).with_name("noise_prior.toml")
DEFAULTS = {"threshold": 0.01, "alpha": 0.001, "window": 200, "sparkline": 20, "penalty": 3.0, "max_rounds": 6,
            "max_accept": accept.MAX_ACCEPT}
VERDICTS = ("regressed", "accepted", "improved", "unchanged", "noisy", "new", "missing")


@dataclass
class Verdict:
    name: str
    machine: str
    verdict: str  # one of VERDICTS
    unit: str = ""
    direction: str = "lower"
    base: float | None = None
    head: float | None = None
    change: float | None = None  # relative change of head vs the baseline level (signed, raw)
    worse: float | None = None  # relative change in the bad direction (> 0 = worse)
    baseline: float | None = None  # the current level of the history (median since the last change point)
    threshold: float = 0.01  # the floor of practical significance
    reason: str = ""
    env: str = ""
    run_to_run: float | None = None  # relative run-to-run sd used (posterior)
    within_run: float | None = None  # relative sd of the head's median from its own samples
    dof: float | None = None
    detectable: float | None = None  # smallest change one run can call regressed
    detectable_confirmed: float | None = None  # ... after max_rounds confirmation rounds
    runs: int = 0  # history runs behind the level and spread
    confirmation: dict | None = None  # filled by `ci perf` when the verdict was re-measured
    attribution: list[dict] = field(default_factory=list)  # decode: which phases/ops moved (base -> head)
    history: list[float] = field(default_factory=list)
    change_points: list[dict] = field(default_factory=list)


# --- configuration -------------------------------------------------------------------------------------


def load_toml(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise DataError(f"unreadable configuration {path}: {exc}") from None


def load_thresholds(path: str | Path | None = None, priors: str | Path | None = None) -> dict:
    """{"defaults", "thresholds": {glob: floor}, "priors": {machine glob: {benchmark glob: Prior}}}."""
    data = load_toml(Path(path) if path else THRESHOLDS_FILE)
    defaults = {**DEFAULTS, **data.get("defaults", {})}
    for key in ("threshold", "alpha"):
        if not 0 < float(defaults[key]) < 1:
            raise DataError(f"{path or THRESHOLDS_FILE}: defaults.{key} must be in (0, 1), got {defaults[key]}")
    if not 0 < float(defaults["max_accept"]) <= 10:  # (a bound past 100%: a trade that may double a time)
        raise DataError(f"{path or THRESHOLDS_FILE}: defaults.max_accept must be in (0, 10], got {defaults['max_accept']}")
    prior_data = load_toml(Path(priors) if priors else PRIOR_FILE)
    priors_out = {}
    for machine, table in prior_data.get("machines", {}).items():
        priors_out[machine] = {pat: noise.Prior(float(v["sigma"]), float(v["runs"])) for pat, v in table.items()}
    return {"defaults": defaults, "thresholds": dict(data.get("thresholds", {})), "priors": priors_out}


def threshold_for(name: str, config: dict) -> float:
    value = history.match_pattern(name, config["thresholds"])
    return float(value if value is not None else config["defaults"]["threshold"])


def prior_for(machine: str, name: str, config: dict) -> noise.Prior | None:
    table = history.match_pattern(machine, config.get("priors", {}))
    return history.match_pattern(name, table) if table else None


def worse_fraction(base: float, head: float, direction: str) -> float:
    """Relative change in the bad direction: +0.1 = 10% worse, whatever the unit's direction."""
    change = (head - base) / abs(base) if base else 0.0
    return change if direction != "higher" else -change


# --- per benchmark -------------------------------------------------------------------------------------


def judge(name: str, machine: str, base_run: Run, head_run: Run, series_runs: list[Run], config: dict) -> Verdict:
    """The verdict for one benchmark; series_runs: the comparable history up to and including the base run,
    oldest first."""
    d = config["defaults"]
    floor, alpha, rounds = threshold_for(name, config), float(d["alpha"]), int(d["max_rounds"])
    head_pt, base_pt = head_run.points[name], base_run.points[name]
    v = Verdict(name, machine, "unchanged", head_pt.unit, head_pt.direction, base_pt.value, head_pt.value,
                threshold=floor, env=head_run.env or "")
    if head_pt.version and base_pt.version and head_pt.version != base_pt.version:
        v.verdict, v.reason = "new", "benchmark version changed (asv: not comparable): a new series starts"
        return v
    pts = [(r, r.points[name]) for r in series_runs if name in r.points and not r.points[name].throttled
           and (not head_pt.version or r.points[name].version in (None, head_pt.version))]
    pts = pts[-int(d["window"]):]
    if head_pt.direction == "info":
        v.change = (head_pt.value - base_pt.value) / abs(base_pt.value) if base_pt.value else None
        v.reason = "informational metric: shown, never gated"
        v.history = ([p.value for _, p in pts] + [head_pt.value])[-int(d["sparkline"]):]
        return v
    x = [noise.log_worse(p.value, head_pt.direction) for _, p in pts]
    model = noise.fit_series(x, prior_for(machine, name, config), float(d["penalty"]))
    x_head = noise.log_worse(head_pt.value, head_pt.direction)
    within = noise.within_run_sd(head_pt.samples)
    sd = model.predict(within)
    level = model.level if x else noise.log_worse(base_pt.value, head_pt.direction)
    change = x_head - level
    crit = noise.critical(alpha, model.dof) if model.dof >= 1 else math.inf
    x_base = noise.log_worse(base_pt.value, head_pt.direction)
    within_both = max(within, noise.within_run_sd(base_pt.samples))
    confirmable = noise.confirm_margin(within_both, model.sigma, rounds, alpha)
    other = None  # the base run, when the head is judged against it as well as against a level
    if model.segment == 1 and len(x) > 1 and math.isfinite(model.previous) and not base_pt.throttled:
        # the base run stands alone (a step at base, a new level, or a spike: one run cannot tell)
        level, other = model.previous, x_base
    elif math.isfinite(sd) and not base_pt.throttled and abs(x_base - level) > crit * sd:
        other = x_base
    if other is None:
        est = noise.Estimate(change, sd, model.dof, model.tail)
        decision = noise.decide(est, floor, alpha, confirmable)
    else:
        # judged against both: the verdict is the smaller change's. When the head matches the level but is
        # worse than the base (a win at base reverted, or a fast spike at base), confirmation re-measures
        # the base beside the head and settles it; a head that matches a slower base is not blamed again.
        v.reason = "base run is off its level (a step at base or a spike): judged against both; "
        sd = max(sd, math.sqrt(2 * model.sigma ** 2 + within ** 2))
        vs_level, vs_base = x_head - level, x_head - other
        change = min((vs_level, vs_base), key=abs)
        if change == vs_base:
            level = other  # the baseline shown is the reference judged against
        est = noise.Estimate(change, sd, model.dof, model.tail)
        decision = noise.decide(est, floor, alpha, confirmable)
        if decision.verdict == "unchanged" and change != vs_base and vs_base > 0:
            base_decision = noise.decide(noise.Estimate(vs_base, sd, model.dof, model.tail), floor, alpha,
                                         confirmable)
            if base_decision.verdict in ("regressed", "noisy"):
                decision = noise.Decision("noisy", f"{math.expm1(vs_base):+.1%} worse than the base run but "
                                          f"level with the runs before it ({math.expm1(vs_level):+.1%}): "
                                          "needs confirmation", decision.margin)
    v.verdict, v.reason = decision.verdict, v.reason + decision.reason
    sign = 1 if head_pt.direction != "higher" else -1
    v.baseline = math.exp(sign * level)
    v.change = (head_pt.value - v.baseline) / v.baseline
    v.worse = est.worse
    v.runs, v.within_run = len(x), within
    if math.isfinite(model.sigma):
        v.run_to_run, v.dof = model.sigma, model.dof
        v.detectable = max(floor, math.expm1(max(crit * sd, model.tail)))
        if confirmable is not None:
            v.detectable_confirmed = max(floor, math.expm1(confirmable))
    if (head_pt.throttled or head_run.throttled) and v.verdict in ("regressed", "noisy"):
        v.verdict, v.reason = "noisy", "head run was throttled: rerun before trusting it; " + v.reason
    if v.verdict in ("regressed", "improved", "noisy"):
        v.attribution = attribute(base_pt.extra, head_pt.extra)
    series = [p.value for _, p in pts] + [head_pt.value]
    v.history = series[-int(d["sparkline"]):]
    v.change_points = [{"index": s, "commit": pts[s][0].commit, "before": pts[s - 1][1].value,
                        "after": pts[s][1].value} for s in model.starts]
    return v


def confirm(row: dict, base_values: list[float], head_values: list[float], config: dict) -> dict:
    """Re-judge a suspect row from interleaved reruns: base_values[i] and head_values[i] are the medians of
    round i (base and head measured back to back on one machine, ABAB). The rounds' own spread is the noise
    (noise.rounds_estimate); at least two rounds a side are needed. The row's verdict becomes the confirmed
    one and row["confirmation"] says how it was reached."""
    rounds = min(len(base_values), len(head_values))
    if rounds < 1:
        raise ValueError(f"confirm {row['name']}: no rounds measured")
    est = noise.rounds_estimate(base_values, head_values, row["direction"], float(row.get("within_run") or 0.0))
    floor, alpha = float(row["threshold"]), float(config["defaults"]["alpha"])
    first = row.get("confirmation", {}).get("first_pass") if row.get("confirmation") else row["verdict"]
    if est.dof < 2:
        verdict, reason = "noisy", f"{est.worse:+.1%} over {rounds} round(s): too few to confirm (needs 2 a side)"
    else:
        decision = noise.decide(est, floor, alpha, confirm_margin=math.inf)  # no more rounds to come
        verdict = decision.verdict if decision.verdict in ("regressed", "unchanged", "improved") else "noisy"
        reason = decision.reason or f"{est.worse:+.1%}: within the noise of the rounds"
        if verdict == "unchanged" and est.change + decision.margin >= math.log1p(floor):
            # neither significant nor shown to be below the floor: say so rather than call it unchanged
            verdict = "noisy"
            reason = (f"inconclusive: {est.worse:+.1%} ± {noise.margin_pct(decision.margin)} after {rounds} rounds "
                      f"may be above or below the {floor:.1%} floor (more rounds, or a quieter machine, would "
                      "settle it)")
    row.update(verdict=verdict, worse=est.worse,
               reason=f"after {rounds} interleaved rounds (first pass: {first}): {reason}",
               confirmation={"rounds": rounds, "first_pass": first, "base": base_values, "head": head_values,
                             "worse": est.worse, "sd": est.sd if math.isfinite(est.sd) else None,
                             "dof": est.dof})
    return row


def suspects(result: dict) -> list[dict]:
    """Rows a confirmation should re-measure: a first-pass regression, or a change past the floor that the
    noise could not settle."""
    return [b for b in result["benchmarks"] if b["verdict"] in ("regressed", "noisy")]


def attribute(base_extra: dict, head_extra: dict, top: int = 5) -> list[dict]:
    """For decode results that carry their step profile: the phases and ops that moved most between base
    and head (kdengine.engine.profiler.attribute), so a red decode build names the culprit layer."""
    if not (base_extra.get("phase_ms") and head_extra.get("phase_ms")):
        return []
    from kdengine.engine.profiler import attribute as by_part

    return by_part(base_extra, head_extra)[:top]


# --- per machine and overall ---------------------------------------------------------------------------


def branch_history(runs: list[Run], base_run: Run, order: dict[str, int] | None) -> list[Run]:
    """The runs of the base branch up to and including base_run, oldest first: first-parent order when
    known (runs of one commit by when they were made), else by when the runs were made."""
    if order is not None and base_run.commit in order:
        limit = order[base_run.commit]
        picked = [r for r in runs if r.commit in order and order[r.commit] <= limit
                  and (r.commit != base_run.commit or r.date <= base_run.date)]
        return sorted(picked, key=lambda r: (order[r.commit], r.date, r.run_id))
    return [r for r in runs if (r.date, r.run_id) <= (base_run.date, base_run.run_id)]


def pick_base(hist: list[Run], base: Run) -> tuple[Run | None, str]:
    """The base run, or the nearest earlier unthrottled comparable one when base was throttled."""
    if not base.throttled:
        return base, ""
    for run in reversed(hist):
        if not run.throttled and not history.fingerprint_differences(run.fingerprint, base.fingerprint):
            return run, f"base {base.commit[:8]} was throttled: refused; compared with {run.commit[:8]}"
    return None, f"base {base.commit[:8]} was throttled and no unthrottled baseline exists"


def rows_all(run: Run, machine: str, verdict: str, reason: str) -> list[dict]:
    return [asdict(Verdict(n, machine, verdict, p.unit, p.direction, head=p.value, reason=reason,
                           env=run.env or ""))
            for n, p in sorted(run.points.items())]


def needed_runs(hist: MachineHistory, commit: str, what: str) -> list[Run]:
    runs = history.runs_of(hist.runs, commit)
    if not runs and commit in hist.old_format_commits:
        raise DataError(f"{what}: the results of {commit[:10]} are in {hist.old_format_commits[commit]}, "
                        "an asv result file of an old format; asv says: run `asv update`")
    return runs


def gate_env(machine: str, runs: list[Run], head_run: Run, base_commit: str | None, config: dict,
             order: dict[str, int] | None, out: dict) -> list[dict]:
    """The rows of one environment of the head commit."""
    env_runs = [r for r in runs if r.env == head_run.env]
    if base_commit is None:
        out["notes"].append(f"first run on {machine} ({head_run.env}): every benchmark is new")
        return rows_all(head_run, machine, "new", "first run on this machine")
    candidates = [r for r in env_runs if r.commit == base_commit and r is not head_run
                  and (base_commit != head_run.commit or r.date <= head_run.date)]
    if not candidates:
        if base_commit == head_run.commit:
            note = f"no earlier run of {base_commit[:10]} in {head_run.env}: nothing to compare with"
        else:
            note = f"base {base_commit[:10]} has no run in environment {head_run.env!r}: every benchmark is new"
        out["notes"].append(note)
        return rows_all(head_run, machine, "new", note)
    base = candidates[-1]
    if base.commit == head_run.commit:
        out["notes"].append(f"same-commit rerun: {head_run.label} judged against the earlier {base.label} "
                            "(an A/A pair)")
    diffs = history.fingerprint_differences(base.fingerprint, head_run.fingerprint)
    if diffs:
        out["notes"].append("fingerprint mismatch, not compared: " + "; ".join(diffs))
        out["fingerprint_mismatch"] = diffs
        return rows_all(head_run, machine, "new", "other fingerprint")
    moved = history.physical_gpu_change(base.fingerprint, head_run.fingerprint)
    if moved:
        out["notes"].append(moved)
    hist = [r for r in branch_history(env_runs, base, order) if r is not head_run and not r.throttled
            and not history.fingerprint_differences(r.fingerprint, head_run.fingerprint)]
    base_run, note = pick_base(hist, base)
    if note:
        out["notes"].append(note)
    if not head_run.has_samples:
        out["notes"].append(f"head {head_run.label} has no samples file: judged on its run medians only")
    upto = hist[:hist.index(base_run) + 1] if base_run in hist else [base_run]
    rows = []
    for name in sorted(set(head_run.points) | set(base.points)):
        if name not in head_run.points:
            p = base.points[name]
            rows.append(asdict(Verdict(name, machine, "missing", p.unit, p.direction, base=p.value,
                                       env=head_run.env or "", reason="not measured in the head run")))
        elif base_run is None or name not in base_run.points:
            p = head_run.points[name]
            rows.append(asdict(Verdict(name, machine, "new", p.unit, p.direction, head=p.value,
                                       env=head_run.env or "")))
        else:
            rows.append(asdict(judge(name, machine, base_run, head_run, upto, config)))
    return rows


def gate_machine(machine: str, runs: list[Run] | MachineHistory, base_sha: str | None, head_sha: str,
                 config: dict, repo: str | None = None) -> dict:
    """The report of one machine: every environment of the head commit judged on its own."""
    hist = runs if isinstance(runs, MachineHistory) else MachineHistory(machine, list(runs))
    out = {"machine": machine, "base": base_sha, "head": head_sha, "notes": [], "benchmarks": []}
    commits = [r.commit for r in hist.runs] + list(hist.old_format_commits)
    try:
        head = history.resolve_commit(commits, head_sha, "--head")
    except history.UnknownCommit:
        out["notes"].append(f"no results for head {head_sha[:10]} on {machine}")
        return out
    head_runs = needed_runs(hist, head, "--head")
    base = None if base_sha is None else history.resolve_commit(commits, base_sha, "--base")
    if base is not None:
        needed_runs(hist, base, "--base")
    out["head"], out["base"] = head, base
    order = history.first_parent_order(repo, base) if repo and base else None
    for path, why in hist.set_aside.items():
        out["notes"].append(f"set aside {path}: {why}")
    newest = {}
    for r in head_runs:
        newest[r.env] = r  # runs are in the order they were made: the last one wins
    for head_run in newest.values():
        out["benchmarks"].extend(gate_env(machine, hist.runs, head_run, base, config, order, out))
    return out


def unsettled(row: dict) -> bool:
    """A row the confirmation left "noisy" although its rounds still put it past the floor in the bad
    direction: neither confirmed nor dismissed. A first pass alone (`ci gate`, no rounds) is never unsettled:
    its "noisy" asks for the confirmation that `ci perf` runs."""
    conf = row.get("confirmation")
    if row.get("verdict") != "noisy" or not isinstance(conf, dict) or conf.get("worse") is None:
        return False
    return float(conf["worse"]) >= float(row.get("threshold") or 0.0)


def summarize(base: str | None, head: str, reports: list[dict], accepted: list[dict] | None = None,
              accept_notes: list[str] | None = None, apply: bool = True) -> dict:
    """The overall verdict: exit 1 on a confirmed regression, else 3 (amber) when a slowdown stayed unsettled
    after its confirmation rounds, else 0. accepted (ci/accept.py, as dicts): the intended trades of the commits
    judged, kept in the result; unless apply is False, a regressed or unsettled row they cover within its bound
    becomes "accepted" (in place)."""
    rows = [b for r in reports for b in r["benchmarks"]]
    notes = list(accept_notes or [])
    if accepted and apply:
        notes += accept.apply(rows, accepted, lambda b: b["verdict"] == "regressed" or unsettled(b))
    regressed = [b["name"] for b in rows if b["verdict"] == "regressed"]
    open_rows = [b["name"] for b in rows if unsettled(b)]
    out = {"base": base, "head": head, "machines": reports, "benchmarks": rows, "regressed": regressed,
           "unsettled": open_rows, "exit_code": 1 if regressed else 3 if open_rows else 0,
           "counts": {v: sum(b["verdict"] == v for b in rows) for v in VERDICTS}}
    if accepted:
        out["accepted"] = list(accepted)
    if notes:
        out["accept_notes"] = notes
    return out


def run_gate(results_dir: str, base: str | None, head: str, machine: str | None = None,
             thresholds: str | None = None, repo: str | None = None, priors: str | None = None,
             apply_accepted: bool = True) -> dict:
    """Judge `head` against `base` (None: an explicit first run, everything new) on every machine that has
    results for head (or just `machine`). With `repo`, the Perf-Accepted trailers of base..head are read
    (result["accepted"], ci/accept.py) and applied, unless apply_accepted is False (`ci perf` applies them after
    its confirmation rounds, so that a bound is held to the confirmed figure)."""
    config = load_thresholds(thresholds, priors)
    if base is not None and not base.strip():
        raise DataError("--base: empty commit (use --first-run for a machine's first run)")
    machines = history.load_histories(results_dir, machine)
    if machine is not None and machine not in machines:
        raise DataError(f"--machine: no results for machine {machine!r} in {results_dir}")
    reports = [gate_machine(m, h, base, head, config, repo) for m, h in machines.items()]
    reports = [r for r in reports if r["benchmarks"] or machine]
    if not reports:
        raise DataError(f"--head: no results for commit {head} in {results_dir}")
    found, notes = [], []
    if repo:  # the commits judged: base and head as the reports resolved them (full shas)
        found, notes = accept.read(repo, reports[0]["base"], reports[0]["head"],
                                   float(config["defaults"]["max_accept"]))
    return summarize(base, head, reports, [asdict(a) for a in found], notes, apply=apply_accepted)


def add_parser(sub) -> None:
    p = sub.add_parser("gate", help="judge head against base and history (first pass, no reruns); exit 1 on a "
                                    "regression",
                       description=__doc__)
    p.add_argument("--results-dir", default="perf_history")
    g = p.add_mutually_exclusive_group(required=True)
    g.add_argument("--base", help="base commit (full sha, or a unique prefix of >= 4 characters)")
    g.add_argument("--first-run", action="store_true", help="no base: the machine's first run (all new)")
    p.add_argument("--head", required=True, help="head commit")
    p.add_argument("--machine", default=None)
    p.add_argument("--thresholds", default=None, help="floors TOML (default ci/thresholds.toml)")
    p.add_argument("--priors", default=None, help="run-to-run priors TOML (default ci/noise_prior.toml)")
    p.add_argument("--repo", default=None, help="git repo for the base branch's first-parent order and the "
                                                "Perf-Accepted trailers of the commits judged (base..head)")
    p.add_argument("--json", default=None, help="write the verdicts as JSON here")
    p.add_argument("--markdown", default=None, help="write the markdown report here")
    p.set_defaults(func=main)


def main(args) -> int:
    from ci import report

    result = run_gate(args.results_dir, None if args.first_run else args.base, args.head, args.machine,
                      args.thresholds, args.repo, args.priors)
    report.write_outputs(result, args.json, args.markdown)
    print(report.render_markdown(result))
    return result["exit_code"]
