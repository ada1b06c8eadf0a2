"""The `kdengine` command line: one subcommand per verb. Each subcommand module registers itself
through `add_parser(subparsers)` and runs through the `func` it sets."""

from __future__ import annotations

import argparse
import importlib
import json
import sys

# Subcommand modules (each defines add_parser(subparsers)).
SUBCOMMANDS = (
    "kdengine.cli_info",
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
        importlib.import_module(name).add_parser(sub)
    return parser


def run_subcommand(parser: argparse.ArgumentParser, argv, name: str, errors: tuple = (ValueError, RuntimeError)) -> int:
    """Parse argv and run the chosen subcommand's func; help and exit 2 without one, and a one-line
    `<name> <command>: error: ...` with exit 2 for the expected errors. Shared with `python -m ci`."""
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except errors as exc:
        print(f"{name} {args.command}: error: {exc}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    return run_subcommand(build_parser(), argv, "kdengine")


def print_json_or_table(data: dict, as_json: bool) -> None:
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return
    width = max(len(k) for k in data)
    for key, value in data.items():
        print(f"{key:<{width}}  {value}")


if __name__ == "__main__":
    sys.exit(main())
