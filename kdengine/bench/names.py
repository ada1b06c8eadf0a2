"""The character sets of the names that reach reports and asv's HTML site, checked where names are made
and again where results are recorded: nothing HTML- or markdown-like can hide in a name.

- workload names (history keys, e.g. `verify-nsplit/cuda/ctx65536/T16/sauto`): `[A-Za-z0-9._/=+-]`,
  starting with a letter or digit, at most 200 characters;
- machine names (a perf_history directory, e.g. `gpu-nvidia-h200-sm90`): `[A-Za-z0-9._-]`, starting
  with a letter or digit, at most 100 characters;
- asv benchmark names (`bench_verify.Verify.time_verify`): `[A-Za-z0-9_.]`, and asv parameter values as
  asv writes them (`'triton'`, `4096`): the workload set, optionally in single quotes;
- free text shown by asv's site (units, machine.json fields): any printable text without `<>&"'` or a
  backtick, at most 500 characters.

Each check returns the name unchanged or raises ValueError naming the argument, the bad character and the
allowed set.
"""

from __future__ import annotations

import re

WORKLOAD_CHARS = "A-Za-z0-9._/=+-"
MACHINE_CHARS = "A-Za-z0-9._-"
ASV_NAME_CHARS = "A-Za-z0-9_."
WORKLOAD_RE = re.compile(rf"[A-Za-z0-9][{WORKLOAD_CHARS}]{{0,199}}")
MACHINE_RE = re.compile(rf"[A-Za-z0-9][{MACHINE_CHARS}]{{0,99}}")
ASV_NAME_RE = re.compile(rf"[A-Za-z_][{ASV_NAME_CHARS}]{{0,199}}")
ASV_PARAM_RE = re.compile(rf"'[{WORKLOAD_CHARS}]{{0,100}}'|[{WORKLOAD_CHARS}]{{1,100}}")
PLAIN_TEXT_RE = re.compile(r"[^<>&\"'`\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]{0,500}")


def _check(value: object, pattern: re.Pattern, chars: str, what: str) -> str:
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected a string, got {type(value).__name__} {value!r}")
    if pattern.fullmatch(value):
        return value
    bad = sorted({c for c in value if not re.fullmatch(f"[{chars}]", c)})
    detail = f"characters {''.join(bad)!r} are not allowed" if bad else "wrong shape or length"
    raise ValueError(f"{what}: expected a name of [{chars}] (starting with a letter or digit), "
                     f"got {value[:120]!r}: {detail}")


def check_workload_name(name: object, what: str = "name") -> str:
    """A workload (benchmark history) name, e.g. `verify/cuda/ctx65536/T16`."""
    return _check(name, WORKLOAD_RE, WORKLOAD_CHARS, what)


def check_machine_name(name: object, what: str = "machine") -> str:
    """A machine name, e.g. `gpu-nvidia-h200-sm90` (it becomes a directory: no `/`, no leading dot)."""
    return _check(name, MACHINE_RE, MACHINE_CHARS, what)


def check_asv_name(name: object, what: str = "asv benchmark name") -> str:
    """An asv benchmark name, e.g. `bench_verify.Verify.time_verify`."""
    return _check(name, ASV_NAME_RE, ASV_NAME_CHARS, what)


def check_asv_param(value: object, what: str = "asv parameter value") -> str:
    """One asv parameter value as asv stores it: `'triton'` (a repr'd string) or `4096`."""
    return _check(value, ASV_PARAM_RE, WORKLOAD_CHARS, what)


def check_plain_text(value: object, what: str = "text") -> str:
    """Free text for asv's site (a unit, a machine.json field): no HTML-significant or control characters."""
    if not isinstance(value, str):
        raise ValueError(f"{what}: expected a string, got {type(value).__name__} {value!r}")
    if not PLAIN_TEXT_RE.fullmatch(value):
        raise ValueError(f"{what}: expected text without <>&\"'` or control characters (at most 500), "
                         f"got {value[:120]!r}")
    return value
