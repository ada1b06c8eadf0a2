"""Intended trades: a commit that makes one benchmark slower on purpose says so in its message, and the gate
shows that benchmark's confirmed slowdown as "accepted" instead of failing the build on it.

The commit message carries one git trailer per benchmark (git's own trailer rules: the last paragraph, `Key: value`):

    Perf-Accepted: verify/cuda/ctx65536/T64 3% merge 7 is 1-2% faster at the five other sizes

- the benchmark's exact name (no pattern: each trade is named), a bound (a percentage, at most `max_accept` of
  ci/thresholds.toml's [defaults]: 10% unless raised there, up to 1000%), then the reason (required; shown in every
  report, escaped there);
- only the commits being judged count: those reachable from head and not from base (`git rev-list base..head`),
  so a trade is accepted once, at the commit that made it, and never carries over to later commits;
- a row is accepted only when its slowdown is confirmed or unsettled (regressed, or "noisy" past its floor after the
  confirmation rounds) and no larger than the bound (the confirmed figure when there is one); past the bound it stays
  red and its reason names the bound it broke;
- a trailer that does not parse (unknown benchmark syntax, no bound, a bound past the cap, no reason) accepts nothing
  and is listed in the report with why; an accepted name that nothing needed is listed too.
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass

from ci.report import INVISIBLE  # control and bidi characters
from kdengine.bench import names

TRAILER = "Perf-Accepted"
MAX_ACCEPT = 0.10  # the default cap on a bound (ci/thresholds.toml [defaults] max_accept overrides it)
REASON_CHARS = 300
VALUE_RE = re.compile(r"(?P<name>\S+)\s+(?P<bound>\d+(?:\.\d+)?)%\s+(?P<reason>\S.*)", re.DOTALL)


@dataclass(frozen=True)
class Acceptance:
    commit: str  # the commit whose message accepts the trade
    name: str  # the benchmark, exactly
    bound: float  # the largest slowdown accepted (0.03 = 3%)
    reason: str


def parse_value(value: str, commit: str, cap: float = MAX_ACCEPT) -> Acceptance:
    """One trailer value -> an Acceptance; ValueError naming what is wrong."""
    m = VALUE_RE.fullmatch(value.strip())
    if m is None:
        raise ValueError(f"expected '<benchmark> <bound>% <reason>', got {value.strip()[:120]!r}")
    name = names.check_workload_name(m["name"], "benchmark")
    bound = float(m["bound"]) / 100.0
    if not 0.0 < bound <= cap:
        raise ValueError(f"bound: expected more than 0% and at most {cap:.0%}, got {m['bound']}%")
    reason = " ".join(m["reason"].split())
    if INVISIBLE.search(reason) or len(reason) > REASON_CHARS:
        raise ValueError(f"reason: at most {REASON_CHARS} printable characters on one line")
    return Acceptance(commit, name, bound, reason)


def read(repo: str, base: str | None, head: str, cap: float = MAX_ACCEPT) -> tuple[list[Acceptance], list[str]]:
    """The acceptances of the commits in base..head, and a note for each trailer that accepts nothing (why).
    No base (a first run) or base == head (a rerun): none. A repository git cannot read is a note, not an error:
    then nothing is accepted."""
    if base is None or base == head:
        return [], []
    fmt = f"%H%x1f%(trailers:key={TRAILER},valueonly,unfold,separator=%x1e)%x00"
    try:
        out = subprocess.run(["git", "-C", repo, "log", f"--format={fmt}", f"{base}..{head}", "--"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as e:
        detail = getattr(e, "stderr", "") or str(e)
        return [], [f"{TRAILER} trailers not read (git log {base[:10]}..{head[:10]} failed: "
                    f"{' '.join(str(detail).split())[:200]}): nothing is accepted"]
    accepted, notes = [], []
    for entry in out.split("\x00"):
        commit, _, values = entry.strip("\n").partition("\x1f")
        for value in filter(str.strip, values.split("\x1e")):
            try:
                accepted.append(parse_value(value, commit, cap))
            except ValueError as e:
                notes.append(f"{TRAILER} in {commit[:10]} accepts nothing: {e}")
    return accepted, notes


def slowdown(row: dict) -> float | None:
    """The slowdown an acceptance is held to: the confirmation's when the row was re-measured, else the first pass's."""
    conf = row.get("confirmation")
    worse = conf.get("worse") if isinstance(conf, dict) and conf.get("worse") is not None else row.get("worse")
    return float(worse) if isinstance(worse, (int, float)) else None


def apply(rows: list[dict], accepted: list[dict], needs_it) -> list[str]:
    """Mark the rows an acceptance covers (in place): `needs_it(row)` says whether a row's verdict would fail or
    hold the build (regressed, unsettled). Returns notes for the acceptances that covered no row."""
    # Acceptances by position in `accepted`: one commit may name a benchmark twice (two trailers), so neither
    # (commit, name) nor the dicts' values tell two of them apart.
    used: set[int] = set()
    decided_by: dict[int, int] = {}  # another acceptance of a row's benchmark -> the widest, which decided
    by_name: dict[str, list[int]] = {}
    for i, a in enumerate(accepted):
        by_name.setdefault(a["name"], []).append(i)
    verdicts: dict[str, set[str]] = {}  # the verdicts of each benchmark's rows (one per machine)
    for row in rows:
        verdicts.setdefault(row.get("name"), set()).add(str(row.get("verdict")))
    for row in rows:
        if row.get("verdict") == "accepted" or not needs_it(row) or row.get("name") not in by_name:
            continue
        worse = slowdown(row)
        named = by_name[row["name"]]
        top = max(named, key=lambda i: accepted[i]["bound"])  # several trailers may name it: the widest bound
        used.add(top)
        decided_by.update({i: top for i in named if i != top})
        a = accepted[top]
        where = f"{TRAILER} in {a['commit'][:10]}: up to {a['bound']:.1%}, {a['reason']}"
        if worse is not None and worse <= a["bound"]:
            row["verdict"] = "accepted"
            row["acceptance"] = dict(a)
            row["reason"] = f"an intended trade ({where}); " + str(row.get("reason", ""))
        else:
            shown = "unknown" if worse is None else f"{worse:+.1%}"
            row["reason"] = f"{shown} is past the accepted bound ({where}); " + str(row.get("reason", ""))

    def note(i: int) -> str:
        a = accepted[i]
        head = f"{TRAILER} in {a['commit'][:10]} for {a['name']} (up to {a['bound']:.1%})"
        if i not in decided_by:
            seen = verdicts.get(a["name"], set())
            if not seen:
                return f"{head}: not measured here"
            if "noisy" in seen:  # e.g. a confirmation cut short: undecided, not a slowdown it covered
                return f"{head}: its row is undecided here (noisy); the bound applies to a confirmed slowdown"
            return f"{head}: no slowdown of it needed accepting here"
        w = accepted[decided_by[i]]
        which = "the wider bound" if w["bound"] > a["bound"] else "the same bound, named again"
        return f"{head}: {which} in {w['commit'][:10]} (up to {w['bound']:.1%}) decided"

    return [note(i) for i in range(len(accepted)) if i not in used]
