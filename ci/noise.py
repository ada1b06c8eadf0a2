"""The noise model behind every "regressed": what another run of unchanged code would show.

Two spreads are kept apart. Within-run spread (one run's samples) says how well that run's median is
known; run-to-run spread (the medians of repeated runs of the same code) says what a rerun would show. On
real GPU runs the second is often far larger than the first (the eager fp32 reference: samples within
0.5%, runs 5-32% apart), so a test on pooled samples reads drift as "p=1e-15". Here a change is judged in
log space against a prediction interval for a new run:

    run-to-run sigma   pooled residuals of the run medians around their segment's level (segments split
                       by change points, KernelCPD from ruptures), same-commit reruns included, combined
                       with the machine's calibrated prior (ci/noise_prior.toml) as a scaled inverse-chi2
                       posterior: sigma^2 = (nu0 s0^2 + sum r^2) / (nu0 + nu), Student t with nu0 + nu dof;
    heavy tails        with >= 30 residuals, the empirical 1-alpha quantile of |residual| is a lower
                       bound of the margin (benchmarks with frequent one-run spikes need more to be red);
    practical floor    the estimated change itself must pass the benchmark's threshold.

Confirmation (`rounds_estimate`): base and head re-measured alternately (ABAB) on one machine; slow drift
hits both sides, so the rounds' own spread (a two-sample t with 2R-2 dof) is the noise, not the history's
(which includes drift between sessions: on the H200 1-1.7% between machine sessions against 0.02-0.3%
within one).

`decide()` is the one rule that says regressed / improved / noisy / unchanged: the gate's first pass, the
confirmation reruns of `ci perf` and `ci bisect` all call it.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

import numpy as np
from scipy import stats

MIN_SEGMENT = 2  # a level needs two runs: one run off the line is a spike until a second agrees
ROBUST_MIN_DOF = 8  # residual degrees of freedom before the robust (MAD) spread replaces the classical one
TAIL_MIN = 30  # residuals needed before their empirical quantile is trusted
MEDIAN_SE = 1.2533 * 1.4826  # standard error of a median from the MAD, for normal-ish noise


@dataclass
class Prior:
    sigma: float  # relative run-to-run spread (log scale) of this benchmark on this machine
    runs: float  # how many runs' worth of evidence it carries (nu0)


@dataclass
class Decision:
    verdict: str  # regressed / improved / noisy / unchanged
    reason: str
    margin: float  # log change needed to be significant (0 when the spread is unknown)


@dataclass
class Estimate:
    """A change in log space, positive = worse, with its standard deviation and degrees of freedom."""
    change: float
    sd: float
    dof: float
    tail: float = 0.0  # empirical |residual| quantile (log), a lower bound of the margin

    @property
    def worse(self) -> float:
        """Relative change in the bad direction (+0.05 = 5% worse)."""
        return math.expm1(self.change)


# A confirmation round's median (base and head back to back on one machine) spreads more than one run's
# samples say: on the H200, rounds in one session agreed within 0.02-0.3% while a run's within-run sd of the
# median was 0.02-0.07% (perf_history/gate). Used only to say whether confirmation could settle a change.
ROUNDS_OVER_WITHIN = 5.0


def confirm_margin(within: float, sigma: float, rounds: int, alpha: float) -> float | None:
    """The log change `rounds` ABAB rounds a side could resolve (their own spread, 2R-2 dof), or None when
    nothing says how they spread. Rounds run back to back on one machine, so the history's run-to-run sigma
    (machine sessions, boards, undetected steps) does not bound them: a round's spread is estimated from the
    noise inside one run (within: the within-run sd of a median, times ROUNDS_OVER_WITHIN), never above the
    history's sigma (which stands in without samples)."""
    candidates = [sd for sd in (ROUNDS_OVER_WITHIN * within, sigma) if math.isfinite(sd) and sd > 0]
    if not candidates:
        return None
    return critical(alpha, 2 * rounds - 2) * min(candidates) * math.sqrt(2 / rounds)


def log_worse(value: float, direction: str) -> float:
    """Log of a value, signed so that larger = worse."""
    return math.log(value) if direction != "higher" else -math.log(value)


def within_run_sd(samples: list[float] | None) -> float:
    """Relative standard error of one run's median from its samples (0 without samples)."""
    if not samples or len(samples) < 3:
        return 0.0
    med = statistics.median(samples)
    mad = statistics.median(abs(s - med) for s in samples)
    return float(MEDIAN_SE * mad / math.sqrt(len(samples)) / abs(med)) if med else 0.0


def critical(alpha: float, dof: float) -> float:
    return float(stats.t.ppf(1.0 - alpha, dof)) if dof < 1e6 else float(stats.norm.ppf(1.0 - alpha))


def decide(est: Estimate, floor: float, alpha: float, confirm_margin: float | None = None) -> Decision:
    """The verdict for a change. confirm_margin: the log change the confirmation rounds could resolve; when
    even that cannot make a change of this size significant, an insignificant change is "unchanged" (within
    noise), not "noisy" (which asks for confirmation)."""
    worse = est.worse
    if est.dof < 1 or not math.isfinite(est.sd):
        if worse >= floor:
            return Decision("noisy", f"{worse:+.1%} but the run-to-run spread is unknown (too few runs and no "
                                     "calibrated prior): needs confirmation", 0.0)
        return Decision("unchanged", "run-to-run spread unknown; below the floor", 0.0)
    margin = max(critical(alpha, est.dof) * est.sd, est.tail)
    sig = f"beyond the {margin_pct(margin)} noise margin of a rerun (sd {est.sd:.2%}, {est.dof:.0f} dof)"
    if est.change > margin and worse >= floor:
        return Decision("regressed", f"{worse:+.1%} worse, {sig}, and past the {floor:.1%} floor", margin)
    better = -math.expm1(est.change)  # +0.05 = 5% better
    if -est.change > margin and better >= floor:
        return Decision("improved", f"{better:.1%} better, {sig}: refresh the baseline on purpose", margin)
    # past the floor either way but not beyond the margin: not "unchanged" (a 2x change inside a wide margin
    # is not evidence of no change); confirmation settles it, unless even it could not
    what = f"{worse:+.1%} worse" if est.change > 0 else f"{better:.1%} better"
    if (worse >= floor and est.change > 0) or (better >= floor and est.change < 0):
        if confirm_margin is not None and abs(est.change) <= confirm_margin:
            return Decision("unchanged", f"{what} is within the noise even after confirmation "
                                         f"(margin {margin_pct(margin)})", margin)
        return Decision("noisy", f"{what} but within the {margin_pct(margin)} noise margin of a "
                                 "rerun: needs confirmation", margin)
    return Decision("unchanged", "", margin)


def margin_pct(margin: float) -> str:
    """A margin as a percentage; past 100% the number says nothing more than "confirmation decides"."""
    pct = math.expm1(margin)
    return f"{pct:.1%}" if pct <= 1.0 else "over-100%"


def rounds_estimate(base: list[float], head: list[float], direction: str, floor_sd: float = 0.0) -> Estimate:
    """The change of head vs base from interleaved rounds (each value one run's median): difference of the
    mean logs, pooled two-sample sd with len(base) + len(head) - 2 dof (never below floor_sd, the
    within-run sd of one median)."""
    xb = [log_worse(v, direction) for v in base]
    xh = [log_worse(v, direction) for v in head]
    dof = len(xb) + len(xh) - 2
    if len(xb) < 2 or len(xh) < 2:
        return Estimate(statistics.fmean(xh) - statistics.fmean(xb), math.inf, 0.0)
    mb, mh = statistics.fmean(xb), statistics.fmean(xh)
    ss = sum((x - mb) ** 2 for x in xb) + sum((x - mh) ** 2 for x in xh)
    s = max(math.sqrt(ss / dof), floor_sd)
    return Estimate(mh - mb, s * math.sqrt(1 / len(xb) + 1 / len(xh)), float(dof))


# --- the series model ---------------------------------------------------------------------------------


def change_points(x: np.ndarray, scale: float, penalty: float) -> list[int]:
    """Indices where a new level starts (KernelCPD, linear kernel = least squares, ruptures). Segments are
    at least MIN_SEGMENT runs, except at the two ends, where one run may stand alone: the oldest can close a
    level that began before the window (or the history), the newest (the base) can open one. The segment
    rule cannot see either (four H200 runs 139, 124.5, 124.4, 126.2 µs otherwise split 2 + 2 and read as
    5.6% run-to-run noise; a 2x kernel win at the base made the next commit's runs look like noise)."""
    n = len(x)
    if n < 2 or scale <= 0:
        return []
    z = (np.asarray(x, dtype=float) / scale).reshape(-1, 1)
    inner_min = 1 if n == 2 else MIN_SEGMENT  # two runs: the split is both ends at once
    pen = penalty * math.log(n)
    best, best_cost = [], math.inf
    for first_alone in (False, True):
        for last_alone in (False, True):
            a, b = int(first_alone), n - int(last_alone)
            if (first_alone or last_alone) and b - a < inner_min:
                continue
            starts = [1] * first_alone + [s + a for s in _kernel_cpd(z[a:b], pen)] + [b] * last_alone
            # a one-run level fits its run exactly: it costs twice a break, so noise alone rarely pays for it
            cost = _cost(z, starts) + pen * (len(starts) + first_alone + last_alone)
            if cost < best_cost - 1e-9:
                best, best_cost = starts, cost
    return best


def _kernel_cpd(z: np.ndarray, pen: float) -> list[int]:
    if len(z) < 2 * MIN_SEGMENT:
        return []
    import ruptures

    ends = ruptures.KernelCPD(kernel="linear", min_size=MIN_SEGMENT).fit(z).predict(pen=pen)
    return [int(e) for e in ends[:-1]]


def _cost(z: np.ndarray, starts: list[int]) -> float:
    """Least-squares cost of a segmentation (the linear kernel's cost, as KernelCPD minimises it)."""
    bounds = [0, *starts, len(z)]
    return sum(float(np.sum((z[a:b] - z[a:b].mean(axis=0)) ** 2)) for a, b in zip(bounds, bounds[1:], strict=False))


def diff_scale(x: np.ndarray) -> float:
    """Robust noise scale from successive differences (insensitive to level steps)."""
    if len(x) < 3:
        return float(np.std(x)) if len(x) > 1 else 0.0
    d = np.abs(np.diff(x))
    s = 1.4826 * float(np.median(d)) / math.sqrt(2)
    return s if s > 0 else float(np.mean(d)) / math.sqrt(2)


def quiet_scale(x: np.ndarray) -> float:
    """The noise scale the quietest quarter of the successive differences says (>= 3 runs): the difference
    at the lower quartile (an observed one, never interpolated toward a step: with 2-4 differences, the
    smallest), scaled to a normal sd."""
    d = np.abs(np.diff(x))
    return float(np.quantile(d, 0.25, method="lower")) / (math.sqrt(2) * float(stats.norm.ppf(0.625)))


@dataclass
class SeriesModel:
    level: float  # the current level (median of the last segment), log scale, larger = worse
    segment: int  # runs in the last segment
    previous: float  # the level before it (nan when the series has one segment)
    sigma: float  # posterior run-to-run sd (log scale); inf when unknown
    dof: float
    tail: float
    starts: list[int]  # change points: indices of the series where a level starts

    def predict(self, head_within: float = 0.0) -> float:
        """sd of (new run - level) for a run of unchanged code."""
        if not math.isfinite(self.sigma):
            return math.inf
        return math.sqrt(self.sigma ** 2 * (1 + 1 / max(self.segment, 1)) + head_within ** 2)


def fit_series(x: list[float], prior: Prior | None, penalty: float = 3.0) -> SeriesModel:
    """The level and run-to-run spread of a history of log values (oldest first)."""
    arr = np.asarray(x, dtype=float)
    n = len(arr)
    if n == 0:
        return SeriesModel(math.nan, 0, math.nan, math.inf, 0.0, 0.0, [])
    if prior and prior.sigma > 0 and n < ROBUST_MIN_DOF:
        # a short history's successive differences are as much steps as noise: there the machine's calibrated
        # run-to-run spread (the prior) sets the scale of change points, unless even the quietest quarter of
        # the differences says this benchmark is now noisier than its calibration (two runs have only the
        # one difference, which may be the step itself: the prior alone)
        scale = max(prior.sigma, quiet_scale(arr)) if n >= 3 else prior.sigma
    else:
        scale = diff_scale(arr)
    starts = change_points(arr, scale, penalty)
    bounds = [0, *starts, n]
    resid = []
    for a, b in zip(bounds, bounds[1:], strict=False):
        seg = arr[a:b]
        resid.extend(seg - np.median(seg))
    resid = np.asarray(resid)
    nu = max(n - (len(bounds) - 1), 0)
    ss = float(np.sum(resid ** 2))
    if nu >= ROBUST_MIN_DOF:  # robust: a spike must not inflate the spread that judges the next run
        robust = (1.4826 * float(np.median(np.abs(resid)))) ** 2 * nu
        ss = min(ss, robust) if robust > 0 else ss
    # below that, the MAD of residuals around a median is biased low (one residual is 0 by construction):
    # two back-to-back runs 0.02% apart must not stand for a machine whose sessions differ by 1.5%
    nu0, s0 = (prior.runs, prior.sigma) if prior else (0.0, 0.0)
    dof = nu + nu0
    sigma = math.sqrt((nu0 * s0 ** 2 + ss) / dof) if dof > 0 else math.inf
    tail = float(np.quantile(np.abs(resid), 0.99)) if len(resid) >= TAIL_MIN else 0.0
    last = arr[bounds[-2]:]
    previous = float(np.median(arr[bounds[-3]:bounds[-2]])) if len(bounds) > 2 else math.nan
    return SeriesModel(float(np.median(last)), len(last), previous, sigma, float(dof), tail, starts)
