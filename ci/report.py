"""Reports from a gate result: the markdown PR comment / job summary and an HTML page per commit (jinja2
templates in ci/templates/), and a matplotlib PNG of tok/s vs context per backend for one run.

Everything in a gate result that came from a run (benchmark and machine names, notes, reasons,
fingerprint fields, extra fields the gate adds) is treated as hostile: HTML templates are autoescaped
(`.html` and `.html.j2`), and in markdown every interpolated value is escaped as prose unless a filter
made it safe: `code` fences a value in a code span it cannot leave, `num`/`pct`/`pm` format numbers.
Missing or unknown fields render as "—" or in a details list, never as an error. JSON is strict (no NaN).

`python -m ci report --json gate.json [--markdown OUT.md] [--html OUT.html] [--results-dir DIR --commit SHA
--plot OUT.png]`.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import jinja2
from markupsafe import Markup

from ci import history

TEMPLATES = Path(__file__).with_name("templates")
SPARK = "▁▂▃▄▅▆▇█"
VERIFY_RE = re.compile(r"^(?:cpu-)?verify/(?P<backend>[^/]+)/ctx(?P<ctx>\d+)/T(?P<T>\d+)$")
# Row fields the templates show in their own columns; any other field goes to the row's details.
ROW_FIELDS = ("name", "machine", "unit", "direction", "base", "head", "change", "detectable", "verdict", "history",
              "reason", "change_points", "attribution", "confirmation", "acceptance")
MACHINE_FIELDS = ("machine", "base", "head", "notes", "benchmarks")
RESULT_FIELDS = ("base", "head", "machines", "benchmarks", "regressed", "unsettled", "exit_code", "counts", "accepted",
                 "accept_notes", "pending", "interrupted")
# Markdown: characters that could open a link, image, heading, list, emphasis, table cell, code span or
# HTML are backslash-escaped; autolink triggers get an invisible word joiner so GitHub links nothing.
MD_PUNCT = re.compile(r"([\\`*_{}\[\]()#+\-.!|~:=\"'$^])")
MD_ENTITIES = {"&": "&amp;", "<": "&lt;", ">": "&gt;"}
WORD_JOINER = "\u2060"
AUTOLINK = re.compile(r"(@|://|www\.|#(?=\d))", re.IGNORECASE)
INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")  # controls, bidi
DETAIL_CHARS = 300  # a details value longer than this is cut


# --- filters -------------------------------------------------------------------------------------------


def as_number(value: object) -> float | None:
    """value as a finite float, None for anything else (missing, text, NaN, inf)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def sparkline(values: object) -> str:
    numbers = [v for v in map(as_number, values) if v is not None] if isinstance(values, list) else []
    if not numbers:
        return ""
    lo, hi = min(numbers), max(numbers)
    if hi == lo:
        return SPARK[3] * len(numbers)
    return "".join(SPARK[min(7, int((v - lo) / (hi - lo) * 8))] for v in numbers)


def format_number(value: object, unit: object = "") -> str:
    value = as_number(value)
    if value is None:
        return "—"
    unit = unit if isinstance(unit, str) else ""
    if unit == "seconds":
        for scale, suffix in ((1, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
            if abs(value) >= scale or suffix == "ns":
                return f"{value / scale:.3g} {suffix}"
    return f"{value:.4g} {unit}".strip()


def format_pct(value: object) -> str:
    value = as_number(value)
    return "—" if value is None else f"{value:+.1%}"


def format_pm(value: object) -> str:
    """A spread as ±x.x% (the smallest change a run can call regressed); past 100% the history cannot
    judge one run at all (too short, or a step it could not place): said in words, not as ±8393744.5%."""
    value = as_number(value)
    if value is None:
        return "—"
    return f"±{abs(value):.1%}" if abs(value) <= 1.0 else "> ±100% (confirm)"


def format_sha(value: object, width: int = 12) -> str:
    """An abbreviated commit, or a word for none; only hex digits survive."""
    if not isinstance(value, str) or not value:
        return "none"
    return re.sub(r"[^0-9a-fA-F]", "", value)[:width] or "invalid"


def one_line(value: object) -> str:
    """str(value) on one line: control and bidi-override characters become spaces, runs of spaces one."""
    return re.sub(r"\s+", " ", INVISIBLE.sub(" ", str(value)))


def escape_markdown(value: object) -> str:
    """Prose for markdown: one line, markdown punctuation escaped, `<>&` as entities, no autolink, mention
    or issue reference can form."""
    text = AUTOLINK.sub(lambda m: m[0][0] + WORD_JOINER + m[0][1:], one_line(value))
    text = MD_PUNCT.sub(r"\\\1", text)
    return "".join(MD_ENTITIES.get(c, c) for c in text)


def code_span(value: object) -> Markup:
    """value in a markdown code span that no backtick, pipe or newline inside it can end."""
    text = one_line(value).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    pad = " " if text.startswith("`") or text.endswith("`") or not text.strip() else ""
    return Markup(f"{fence}{pad}{text}{pad}{fence}")


def format_detail(value: object) -> str:
    """A compact one-line text of an extra field's value (numbers to 4 significant digits)."""
    if isinstance(value, float):
        return format_number(value)
    if isinstance(value, dict):
        text = ", ".join(f"{k}={format_detail(v)}" for k, v in value.items())
    elif isinstance(value, list):
        text = "[" + ", ".join(format_detail(v) for v in value) + "]"
    else:
        text = str(value)
    return text if len(text) <= DETAIL_CHARS else text[:DETAIL_CHARS] + "…"


def extra_fields(item: object, known: tuple[str, ...]) -> list[tuple[str, str]]:
    """(key, text) for every field of a dict that the templates do not show in a column of their own."""
    if not isinstance(item, dict):
        return []
    return [(str(k), format_detail(v)) for k, v in item.items()
            if k not in known and v is not None and not (isinstance(v, (str, list, dict)) and not v)]


def finalize_markdown(value: object) -> str:
    """Every `{{ }}` of a markdown template: escaped as prose unless a filter already made it safe."""
    if isinstance(value, Markup):
        return value
    if value is None or isinstance(value, jinja2.Undefined):
        return ""
    return escape_markdown(value)


def environment(markdown: bool = False) -> jinja2.Environment:
    """HTML environment: autoescape on for .html and .html.j2; markdown: escape_markdown on every value."""
    options = dict(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True, lstrip_blocks=True,
                   undefined=jinja2.ChainableUndefined)
    if markdown:
        env = jinja2.Environment(autoescape=False, finalize=finalize_markdown, **options)
    else:
        env = jinja2.Environment(autoescape=jinja2.select_autoescape(["html", "html.j2", "htm"]), **options)
    safe = Markup if markdown else str  # made of digits, signs and block characters only
    env.filters.update(spark=lambda v: safe(sparkline(v)), num=format_number,  # num: the unit is text
                       pct=lambda v: safe(format_pct(v)), pm=lambda v: safe(format_pm(v)),
                       sha=lambda v, w=12: safe(format_sha(v, w)), extras=extra_fields)
    if markdown:
        env.filters["code"] = code_span
    env.globals.update(ROW_FIELDS=ROW_FIELDS, MACHINE_FIELDS=MACHINE_FIELDS, RESULT_FIELDS=RESULT_FIELDS)
    return env


# --- renderers -----------------------------------------------------------------------------------------


def render_markdown(result: dict, sparkline_n: int = 20) -> str:
    return environment(markdown=True).get_template("summary.md.j2").render(result=result,
                                                                            sparkline_n=sparkline_n)


def render_html(result: dict, plot: str | None = None) -> str:
    return environment().get_template("commit.html.j2").render(result=result, plot=plot)


def strict_json(result: dict) -> str:
    """The result as strict JSON: non-finite numbers become null (listed under "non_finite")."""
    bad: list[str] = []

    def clean(value, path):
        if isinstance(value, float) and not math.isfinite(value):
            bad.append(path)
            return None
        if isinstance(value, dict):
            return {k: clean(v, f"{path}.{k}") for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [clean(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return value

    data = clean(result, "result")
    if bad:
        data["non_finite"] = bad
    return json.dumps(data, indent=2, default=str, allow_nan=False) + "\n"


def write_outputs(result: dict, json_path: str | None, md_path: str | None,
                  html_path: str | None = None) -> None:
    if json_path:
        Path(json_path).write_text(strict_json(result))
    if md_path:
        Path(md_path).write_text(render_markdown(result))
    if html_path:
        Path(html_path).write_text(render_html(result))


# --- verify table and plot -----------------------------------------------------------------------------


def tokens_per_second(name: str, point: history.Point) -> float | None:
    """tok/s of a verify workload: the value itself for rate units, T / time for a seconds unit."""
    m = VERIFY_RE.match(name)
    if not m:
        return None
    if point.direction == "higher":
        return point.value
    return int(m["T"]) / point.value if point.value > 0 else None


def verify_rows(run: history.Run) -> list[dict]:
    """One row per verify workload: context, T, backend, time, tok/s, speedup over triton_extend, NSPLIT."""
    rows = []
    for name, point in run.points.items():
        m = VERIFY_RE.match(name)
        if not m:
            continue
        rows.append({"name": name, "backend": m["backend"], "ctx": int(m["ctx"]), "T": int(m["T"]),
                     "time": point.value if point.unit == "seconds" else None,
                     "tok_s": tokens_per_second(name, point), "nsplit": point.extra.get("nsplit"),
                     "throttled": point.throttled})
    base = {(r["ctx"], r["T"]): r["tok_s"] for r in rows if r["backend"] == "triton_extend"}
    for r in rows:
        ref = base.get((r["ctx"], r["T"]))
        r["speedup"] = r["tok_s"] / ref if ref and r["tok_s"] else None
    return sorted(rows, key=lambda r: (r["ctx"], r["T"], r["backend"]))


def plot_context(run: history.Run, out_png: str | Path) -> Path | None:
    """tok/s vs context per backend (one line per backend and T). None when the run has no verify data."""
    rows = verify_rows(run)
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for key in sorted({(r["backend"], r["T"]) for r in rows}):
        pts = sorted((r["ctx"], r["tok_s"]) for r in rows if (r["backend"], r["T"]) == key and r["tok_s"])
        if pts:
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=f"{key[0]} T={key[1]}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("tok/s (tree tokens verified per second)")
    ax.set_title(f"{run.machine} @ {run.commit[:10]}")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out_png = Path(out_png)
    fig.savefig(out_png, dpi=110)
    plt.close(fig)
    return out_png


# --- command -------------------------------------------------------------------------------------------


def add_parser(sub) -> None:
    p = sub.add_parser("report", help="render a gate JSON as markdown / HTML; plot tok/s vs context")
    p.add_argument("--json", help="gate result JSON (from `python -m ci gate --json`)")
    p.add_argument("--markdown", help="write markdown here (default: print it)")
    p.add_argument("--html", help="write the per-commit HTML page here")
    p.add_argument("--results-dir", default="perf_history")
    p.add_argument("--commit", help="commit to plot (with --plot)")
    p.add_argument("--machine", help="machine to plot (default: every machine with that commit)")
    p.add_argument("--plot", help="write the tok/s vs context PNG here")
    p.set_defaults(func=main)


def main(args) -> int:
    plot_name = None
    if args.plot:
        if not args.commit:
            raise ValueError("--commit: required with --plot")
        for machine, runs in history.load_all(args.results_dir, args.machine).items():
            run = history.find_run(runs, args.commit)
            if run and plot_context(run, args.plot):
                plot_name = Path(args.plot).name
                print(f"[report] wrote {args.plot} ({machine})")
                break
    if args.json:
        result = json.loads(Path(args.json).read_text())
        if args.html:
            Path(args.html).write_text(render_html(result, plot_name))
        if args.markdown:
            Path(args.markdown).write_text(render_markdown(result))
        else:
            print(render_markdown(result))
    return 0
