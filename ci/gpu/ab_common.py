"""The common parts of the one-call A/B scripts (merge_ab.py, sched_ab.py, aa_rows.py): their JSON report, rewritten after each
step, and the decode engine run once per value of a kdengine.ops.cuda_backend attribute (its module value, read at
every launch)."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable

import torch

from kdengine.bench import fingerprint
from kdengine.ops import cuda_backend


class Report:
    """The script's JSON (--out): the machine's fingerprint (its commit COMMIT where that is set to a full sha, as
    ci/gpu/bundle_run.sh's copied-tree form sets it), `extra`, then "sizes" and "decode" as the steps fill them; save()
    rewrites the file and prints the seconds since the start."""

    def __init__(self, path: str, **extra):
        info = fingerprint.collect()
        sha = os.environ.get("COMMIT", "")
        if re.fullmatch(r"[0-9a-f]{40}", sha):  # a copied working tree, clean at COMMIT: the device's git metadata is stale
            info = fingerprint.named_commit(info, sha)
        self.path, self.t0 = path, time.time()
        self.data = {"fingerprint": {**info, "machine": fingerprint.machine_name(info)}, **extra, "sizes": {},
                     "decode": {}}

    def save(self) -> None:
        with open(self.path, "w") as f:
            json.dump(self.data, f, indent=1, default=str)
        print(f"  ({time.time() - self.t0:.0f} s)", flush=True)


def decode_runs(ctx: int, attr: str, values: tuple, tag: Callable[[object], str], cuda_path: str | None = None,
                budget: int = 63) -> dict:
    """{label: tok/s, mean step, phases} of the engine (the cuda backend, 8 layers of kimi-k2-tp8-rank, random routing,
    CUDA graphs, a draft tree of `budget` tokens: T = budget + 1) at `ctx`, once per entry of `values` in that order
    with cuda_backend.<attr> set to it; label decode<ctx>/<tag(value)>/<k> for the k-th run of that value. cuda_path:
    KDENGINE_CUDA_PATH for the runs."""
    from kdengine.engine.run import DecodeSettings, run_decode

    saved, saved_path = getattr(cuda_backend, attr), os.environ.get("KDENGINE_CUDA_PATH")
    if cuda_path is not None:
        os.environ["KDENGINE_CUDA_PATH"] = cuda_path
    out = {}
    try:
        for i, value in enumerate(values):
            setattr(cuda_backend, attr, value)
            s = DecodeSettings(config="kimi-k2-tp8-rank", layers=8, context=ctx, budget=budget, backend="cuda", steps=32,
                               device="cuda", routing="random")
            d = run_decode(s).to_dict()
            label = f"decode{ctx}/{tag(value)}/{values[:i].count(value)}"
            out[label] = {"tok_per_s": d["tok_per_s"], "mean_step_ms": d["mean_step_ms"], "phase_ms": d["phase_ms"]}
            print(f"{label:32s} {d['tok_per_s']:8.1f} tok/s  step {d['mean_step_ms']:.3f} ms  verify-attention "
                  f"{d['phase_ms'].get('verify-attention', float('nan')):.3f} ms", flush=True)
            torch.cuda.empty_cache()
    finally:
        setattr(cuda_backend, attr, saved)
        if saved_path is None:
            os.environ.pop("KDENGINE_CUDA_PATH", None)
        else:
            os.environ["KDENGINE_CUDA_PATH"] = saved_path
    return out
