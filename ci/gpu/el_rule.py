"""Where seesaw2_el should replace seesaw2 at two row tiles (T * H <= cuda_backend.EL_MAX_ROWS): the decode engine with
a draft tree of T = 16 (8 heads: 128 query rows, the calls seesaw2_el can take), each context run with the sm90
dispatch forced to seesaw2 (A) or to seesaw2_el (B) wherever pick_schedule returns either, in --order (default
A B B A B A A B). pick_schedule's own rule takes seesaw2_el past half the L2 (a sequence's KV capacity larger than
cuda_backend.EL_L2_SHARE of the device's L2; its run: perf_history/kernel/el_l2_97c6a8c/); the kernel-sweep form of
the same question: ci/gpu/sched_ab.py --rows cuda_sm90_seesaw2 cuda_sm90_seesaw2_el ... --sizes 32768:16 ...

    python3 ci/gpu/el_rule.py --out el_engine.json [--ctxs 65536 49152 32768 16384] [--order ABBABAAB]
"""

from __future__ import annotations

import argparse

import torch

from ci.gpu import ab_common
from kdengine.ops import cuda_backend

PICK = cuda_backend.pick_schedule
FAMILY = ("seesaw2", "seesaw2_el")


def forced(schedule: str):
    """pick_schedule with its seesaw2 / seesaw2_el answer replaced by `schedule` at <= EL_MAX_ROWS query rows (its
    other answers kept)."""

    def pick(T, H, *args, **kwargs):
        got = PICK(T, H, *args, **kwargs)
        return schedule if got in FAMILY and T * H <= cuda_backend.EL_MAX_ROWS else got

    pick.__name__ = schedule
    return pick


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", required=True, help="the JSON written (rewritten after each context)")
    p.add_argument("--ctxs", type=int, nargs="+", default=[65536, 49152, 32768, 16384])
    p.add_argument("--order", default="ABBABAAB", help="A = seesaw2, B = seesaw2_el")
    p.add_argument("--budget", type=int, default=15, help="draft tokens (T = budget + 1; T * 8 <= EL_MAX_ROWS)")
    a = p.parse_args()
    if len(a.order) < 2 or set(a.order) - {"A", "B"}:
        raise SystemExit(f"el_rule: --order: expected 2 or more of the letters A and B, got {a.order!r}")
    if (a.budget + 1) * 8 > cuda_backend.EL_MAX_ROWS:
        raise SystemExit(f"el_rule: --budget {a.budget}: T * 8 = {(a.budget + 1) * 8} rows is past EL_MAX_ROWS "
                         f"({cuda_backend.EL_MAX_ROWS}), where seesaw2_el is never picked")
    if not torch.cuda.is_available():
        raise SystemExit("el_rule: needs a CUDA GPU")
    report = ab_common.Report(a.out, order=a.order, budget=a.budget)
    rows = {"A": forced("seesaw2"), "B": forced("seesaw2_el")}
    values = tuple(rows[c] for c in a.order)  # one function per letter: decode_runs counts repeats by identity
    for ctx in a.ctxs:
        report.data["decode"].update(
            ab_common.decode_runs(ctx, "pick_schedule", values, lambda f: f.__name__, budget=a.budget))
        report.save()


if __name__ == "__main__":
    main()
