"""Decode runs of issue 13 on the device, one JSON per run set (called by ci/gpu/engine.sh): run_decode
(`kdengine decode --config kimi-k2-tp8-rank --layers 8 --budget 63`) at each context and routing,
with the fingerprint, the per-phase and per-op profile (ops timed under graph replay) and the step
roofline. Under torchrun (--tp N) every rank runs; rank 0 writes the JSON. The JSON is rewritten
after every run, so a run cut short still returns what it measured.

    python3 ci/gpu/engine_decode.py --out engine_run.json [--ctxs 4096 65536] [--routings random uniform]
    torchrun --nproc-per-node 2 ci/gpu/engine_decode.py --tp 2 --out tp2.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os

import torch

from kdengine.bench import fingerprint
from kdengine.engine import parallel
from kdengine.engine.run import DecodeSettings, run_decode


def line(ctx: int, routing: str, d: dict) -> str:
    ph = " ".join(f"{k}={v:.3f}" for k, v in d["phase_ms"].items())
    ops = " ".join(f"{k}={v:.3f}" for k, v in d["op_ms"].items())
    moe = " ".join(f"{k}={v:.3f}" for k, v in d["moe_op_ms"].items())
    return (f"ctx {ctx} {routing}: {d['tok_per_s']:.1f} tok/s, step {d['mean_step_ms']:.3f} ms (host {d['host_step_ms']:.3f}), "
            f"floor {d['floor_ms']:.3f} ms ({d['step_over_floor']:.2f}x), graphs {d['cuda_graphs_used']}, "
            f"all-reduce {d['all_reduce_ms']:.3f} ms\n  phases {ph}\n  ops {ops}\n  moe {moe}\n  notes {d['notes'][1:]}")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--out", required=True)
    p.add_argument("--ctxs", type=int, nargs="+", default=[4096, 16384, 65536])
    p.add_argument("--routings", nargs="+", default=["random"])
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--steps", type=int, default=32)
    p.add_argument("--backend", default="triton")
    p.add_argument("--config", default="kimi-k2-tp8-rank")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--device", default="cuda")
    a = p.parse_args()
    lead = int(os.environ.get("RANK", "0")) == 0
    info = fingerprint.collect()
    report = {"fingerprint": {**info, "machine": fingerprint.machine_name(info), "clocks": fingerprint.clocks(), "tp": a.tp},
              "decode": {}}

    def save():
        if lead:
            with open(a.out, "w") as f:
                json.dump(report, f, indent=1, default=str)

    for routing in a.routings:
        for ctx in a.ctxs:
            s = DecodeSettings(config=a.config, layers=a.layers, context=ctx, budget=63, backend=a.backend,
                               steps=a.steps, device=a.device, routing=routing, tp=a.tp)
            r = run_decode(s)
            d = r.to_dict()
            report["decode"][f"{routing}/{ctx}"] = d
            if lead:
                print(line(ctx, routing, d), flush=True)
            save()
            del r
            gc.collect()
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    report["fingerprint"]["clocks_end"] = fingerprint.clocks()
    save()
    if a.tp > 1:
        parallel.finish_tp()


if __name__ == "__main__":
    main()
