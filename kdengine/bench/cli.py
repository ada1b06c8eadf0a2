"""`kdengine bench`: run the benchmark workloads outside asv, with a progress bar and a table.

    kdengine bench [--filter REGEX] [--json PATH] [--samples N] [--all] [--list]

Runs this machine's default suite (the GPU suite with a GPU, the embedded CPU default without one);
cases that cannot run here are listed as skipped. --json writes a samples sidecar dict (schema 1,
perf_history/README.md) of the results.
"""

from __future__ import annotations

import json
import re


def add_parser(sub) -> None:
    p = sub.add_parser("bench", help="run the benchmark workloads (outside asv) and print a table")
    p.add_argument("--filter", default=None, help="regular expression on workload names (re.search)")
    p.add_argument("--json", default=None, metavar="PATH", help="write the results as a samples sidecar dict")
    p.add_argument("--samples", type=int, default=None, help="samples per workload (decode: timed steps)")
    p.add_argument("--all", action="store_true", help="every published workload, not only this machine's")
    p.add_argument("--list", action="store_true", help="list the selected workload names and exit")
    p.set_defaults(func=run)


def select(pattern: str | None, everything: bool) -> list:
    from kdengine.bench import workloads

    chosen = workloads.all_workloads() if everything else workloads.default_workloads()
    if pattern is None:
        return chosen
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"--filter: expected a regular expression, got {pattern!r} ({exc})") from None
    return [w for w in chosen if regex.search(w.name)]


def format_value(value: float, unit: str) -> str:
    if unit == "seconds":
        for scale, suffix in ((1, "s"), (1e-3, "ms"), (1e-6, "us")):
            if value >= scale:
                return f"{value / scale:.3g} {suffix}"
        return f"{value * 1e9:.3g} ns"
    return f"{value:.4g} {unit}"


def render_table(records: list[dict], skipped: dict[str, str]):
    from rich.table import Table

    table = Table(title="kdengine bench (unit: lower or higher is better)")
    table.add_column("name", no_wrap=True)
    for column in ("median", "samples", "% roofline"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("unit", no_wrap=True)
    table.add_column("note")
    for r in records:
        pct = r["extra"].get("roofline_pct")
        note = "THROTTLED" if r["throttled"] else r["extra"].get("method", "")
        table.add_row(r["name"], format_value(r["median"], r["unit"]), str(len(r["samples"])),
                      "n/a" if pct is None else f"{pct:.1f}", f"{r['unit']} ({r['direction']})", note)
    for name, reason in skipped.items():
        table.add_row(name, "-", "-", "-", "-", f"skipped: {reason}")
    return table


def peer_ratio_lines(records: list[dict]) -> list[str]:
    """ours / peer per size where a peer was measured in this run (kdengine.bench.peers)."""
    from kdengine.bench import peers

    return peers.ratio_lines({r["name"]: r["median"] for r in records if r["unit"] == "seconds"})


def run(args) -> int:
    from rich.console import Console
    from rich.progress import Progress

    from kdengine.bench import fingerprint, samples, workloads

    if args.samples is not None and args.samples < 1:
        raise ValueError(f"--samples: expected an integer >= 1, got {args.samples}")
    chosen = select(args.filter, args.all)
    if args.list:
        print("\n".join(w.name for w in chosen))
        return 0
    if not chosen:
        raise ValueError(f"--filter: no workload name matches {args.filter!r}")
    records, skipped = [], {}
    console = Console()
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("benchmarking", total=len(chosen))
        for w in chosen:
            progress.update(task, description=w.name)
            reason = workloads.unavailable_reason(w)
            if reason is None:
                records.append(workloads.measure(w, samples=args.samples))
            else:
                skipped[w.name] = reason
            progress.advance(task)
    console.print(render_table(records, skipped))
    for line in peer_ratio_lines(records):
        console.print(line, highlight=False)
    if args.json:
        write_json(args.json, records, fingerprint.commit()["commit"] or "unknown", fingerprint.machine_name(),
                   samples)
    return 0


def write_json(path: str, records: list[dict], commit: str, machine: str, samples_module) -> None:
    """The records as one sidecar dict (same schema as perf_history/samples/)."""
    import tempfile
    from pathlib import Path

    with tempfile.TemporaryDirectory() as tmp:
        jsonl = Path(tmp) / "records.jsonl"
        for r in records:
            samples_module.append_record(r, jsonl)
        data = samples_module.collect_jsonl(jsonl, commit, machine)
    Path(path).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
