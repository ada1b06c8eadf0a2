"""The `kdengine` command line: one subcommand per verb. Each subcommand module registers itself
through `add_parser(subparsers)` and runs through the `func` it sets."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# Subcommand modules (each defines add_parser(subparsers)); missing ones are skipped so the CLI
# keeps working while a verb is being built.
SUBCOMMANDS = (
    "kdengine.cli_info",
    "kdengine.cli_selfcheck",
    "kdengine.ops.build",
    "kdengine.engine.cli",
    "kdengine.bench.cli",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kdengine",
        description="MLA tree-verify attention, a speculative decode engine, and their benchmarks.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in SUBCOMMANDS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name == name:
                continue
            raise
        module.add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except (ValueError, RuntimeError) as exc:
        print(f"kdengine {args.command}: error: {exc}", file=sys.stderr)
        return 2


def print_json_or_table(data: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return
    width = max(len(k) for k in data)
    for key, value in data.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    sys.exit(main())
