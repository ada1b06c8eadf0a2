"""Reports from a gate result: the markdown PR comment / job summary and an HTML page per commit (jinja2
templates in ci/templates/), and a matplotlib PNG of tok/s vs context per backend for one run.

`python -m ci report --json gate.json [--markdown OUT.md] [--html OUT.html] [--results-dir DIR --commit SHA
--plot OUT.png]`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jinja2

from ci import history

TEMPLATES = Path(__file__).with_name("templates")
SPARK = "▁▂▃▄▅▆▇█"
VERIFY_RE = re.compile(r"^(?:cpu-)?verify/(?P<backend>[^/]+)/ctx(?P<ctx>\d+)/T(?P<T>\d+)$")


# --- filters -------------------------------------------------------------------------------------------


def sparkline(values: list[float] | None) -> str:
    if not values:
        return ""
    lo, hi = min(values), max(values)
    if hi == lo:
        return SPARK[3] * len(values)
    return "".join(SPARK[min(7, int((v - lo) / (hi - lo) * 8))] for v in values)


def format_number(value: float | None, unit: str = "") -> str:
    if value is None:
        return "—"
    if unit == "seconds":
        for scale, suffix in ((1, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")):
            if abs(value) >= scale or suffix == "ns":
                return f"{value / scale:.3g} {suffix}"
    return f"{value:.4g} {unit}".strip()


def format_pct(value: float | None) -> str:
    return "—" if value is None else f"{value:+.1%}"


def format_p(value: float | None) -> str:
    return "—" if value is None else f"{value:.2g}"


def environment() -> jinja2.Environment:
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(TEMPLATES), trim_blocks=True,
                             lstrip_blocks=True, autoescape=jinja2.select_autoescape(["html"]))
    env.filters.update(spark=sparkline, num=format_number, pct=format_pct, pval=format_p)
    return env


# --- renderers -----------------------------------------------------------------------------------------


def render_markdown(result: dict, sparkline_n: int = 20) -> str:
    return environment().get_template("summary.md.j2").render(result=result, sparkline_n=sparkline_n)


def render_html(result: dict, plot: str | None = None) -> str:
    return environment().get_template("commit.html.j2").render(result=result, plot=plot)


def write_outputs(result: dict, json_path: str | None, md_path: str | None,
                  html_path: str | None = None) -> None:
    if json_path:
        Path(json_path).write_text(json.dumps(result, indent=2, default=str) + "\n")
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
