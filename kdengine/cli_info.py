"""`kdengine info`: print the environment fingerprint and which verify backends can run here."""

from __future__ import annotations


def add_parser(sub) -> None:
    p = sub.add_parser("info", help="print the environment fingerprint and the usable backends")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    p.set_defaults(func=run)


def run(args) -> int:
    import torch

    from kdengine.bench.fingerprint import collect
    from kdengine.cli import print_json_or_table
    from kdengine.ops.verify import BACKENDS, unavailable_reason

    info = collect()
    device = "cuda" if torch.cuda.is_available() else "cpu"
    for name in BACKENDS:
        reason = unavailable_reason(name, device)
        info[f"backend.{name}"] = "available" if reason is None else f"unavailable: {reason}"
    print_json_or_table(info, args.json)
    return 0
