"""`python -m ci <command>`: one subcommand per module. Exit 0 ok, 1 regression (gate/perf/bisect found
one), 2 usage or data error (a corrupt result file is named)."""

from __future__ import annotations

import argparse
import importlib
import sys

COMMANDS = ("perf", "gate", "calibrate", "record", "report", "bisect", "publish", "evaluate")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m ci", description=__doc__)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        importlib.import_module(f"ci.{name}").add_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    from ci.history import DataError
    from kdengine.cli import run_subcommand

    return run_subcommand(build_parser(), argv, "ci", (DataError, ValueError, RuntimeError))


if __name__ == "__main__":
    sys.exit(main())
