"""asv: engine decode throughput under tensor parallelism: `kdengine decode --tp N` in a torchrun
subprocess (NCCL, one GPU per rank, NVLink multicast off), kimi-k2-tp8-rank per-rank dims (8 heads,
48 experts per process), 8 layers, budget 63, acceptance replay. Workload names (stable, history is
keyed by them): decode-tp<N>/<backend>/ctx<C>. tok/s is HIGHER IS BETTER; the all-reduce share of a
step and the MoE imbalance across ranks (max/mean of tokens routed to each rank's experts) are
tracked beside it. A case needing more GPUs than this machine has raises NotImplementedError in
setup (asv: skipped).

Without asv (the GPU machine has none): `python -m benchmarks.bench_tp --tp 2 --out DIR` runs the cases
at 4k/16k/65k, keeps each rank-0 decode JSON under DIR and appends the samples records (fingerprint
included) to DIR/samples.jsonl, the input of kdengine.bench.samples.collect_jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from benchmarks import common
from kdengine import env
from kdengine.bench import fingerprint
from kdengine.bench import samples as sidecar
from kdengine.bench import workloads as W
from kdengine.engine import parallel

TP_SIZES = (2, 8)
CONFIG, LAYERS, BUDGET, MEAN_ACCEPT, WARMUP = "kimi-k2-tp8-rank", 8, 63, 5.0, 4


def workload_name(tp: int, backend: str, context: int) -> str:
    return f"decode-tp{tp}/{backend}/ctx{context}"


def unavailable_reason(tp: int, backend: str) -> str | None:
    """None when `tp` GPUs and the backend are here, else why not."""
    have = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if have < tp:
        return f"needs {tp} CUDA GPUs, {have} present"
    from kdengine.ops.verify import unavailable_reason as backend_reason

    return backend_reason(backend, "cuda")


def decode_command(tp: int, backend: str, context: int, steps: int, out: Path) -> list[str]:
    """The `kdengine decode --tp` command line of one case (it relaunches itself under torchrun)."""
    return [sys.executable, "-m", "kdengine.cli", "decode", "--tp", str(tp), "--config", CONFIG,
            "--layers", str(LAYERS), "--context", str(context), "--budget", str(BUDGET), "--backend", backend,
            "--steps", str(steps), "--warmup-steps", str(WARMUP), "--mean-accept", str(MEAN_ACCEPT),
            "--acceptance", "replay", "--json", str(out)]


def record_from(result: dict, name: str, tp: int, params: tuple, clocks: tuple[dict, dict]) -> dict:
    """One samples record from the decode JSON of rank 0: per-step tok/s samples (mean tokens per
    step over each step's time), the rank breakdown in extra, the fingerprint with the GPU count."""
    mean_tokens = statistics.fmean(result["tokens_per_step"])
    values = [mean_tokens / t for t in result["step_times_s"]]
    extra = {
        "tok_per_s": result["tok_per_s"], "mean_accept": result["mean_accept"], "phase_ms": result["phase_ms"],
        "all_reduce_ms": result["all_reduce_ms"], "all_reduce_share": result["all_reduce_share"],
        "rank_imbalance": result["rank_imbalance"], "per_rank": result["per_rank"], "policy": result["policy"],
        "engine_backend": result["backend"], "notes": result["notes"], "tp": tp,
        "settings": {"config": CONFIG, "layers": LAYERS, "budget": BUDGET, "mean_accept": MEAN_ACCEPT},
    }
    start, end = clocks
    fp = {**fingerprint.collect(), "machine": fingerprint.machine_name(), "gpus": tp, "clocks_start": start,
          "clocks_end": end, "throttled": fingerprint.throttled(start, end)}
    return sidecar.make_record(
        name=name, unit="tok/s", direction="higher", median=statistics.median(values), samples=values,
        throttled=fp["throttled"], fingerprint=fp, asv_name="bench_tp.TPDecode.track_tok_per_s",
        asv_params=[repr(p) for p in params], extra=extra, run=common.run_id(),
    )


def measure(tp: int, backend: str, context: int, out_dir: Path | None = None) -> dict:
    """Run one case; append its record to KDENGINE_SAMPLES_OUT (when set) and, with out_dir, keep
    the decode JSON there and append the record to out_dir/samples.jsonl too."""
    steps = env.bench_samples() or W.GPU_DECODE_STEPS
    name = workload_name(tp, backend, context)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "decode.json" if out_dir is None else Path(out_dir) / (name.replace("/", "_") + ".json")
        start = fingerprint.clocks(0)  # index given: no CUDA context in this process
        proc = subprocess.run(decode_command(tp, backend, context, steps, out), env=parallel.launch_env(),
                              capture_output=True, text=True, check=False)
        end = fingerprint.clocks(0)
        if proc.returncode != 0:
            raise RuntimeError(f"kdengine decode --tp {tp} failed ({proc.returncode}): {proc.stderr[-2000:]}")
        result = json.loads(out.read_text())
    record = record_from(result, name, tp, (tp, backend, context), (start, end))
    sidecar.append_record(record)
    if out_dir is not None:
        sidecar.append_record(record, Path(out_dir) / "samples.jsonl")
    return record


class TPDecode:
    """GPU x N: decode-tp<N>/<backend>/ctx<C>."""

    params = (list(TP_SIZES), list(W.DECODE_BACKENDS), list(W.CONTEXTS))
    param_names = ["tp", "backend", "context"]
    timeout = 1800

    def setup(self, tp, backend, context):
        reason = unavailable_reason(tp, backend)
        if reason is not None:
            raise NotImplementedError(f"{workload_name(tp, backend, context)}: {reason}")

    def _record(self, tp, backend, context):
        found = sidecar.find_record(workload_name(tp, backend, context), common.run_id())
        return found if found is not None else measure(tp, backend, context)

    def track_tok_per_s(self, *params):
        return self._record(*params)["median"]

    def track_all_reduce_share(self, *params):
        """% of rank 0's step spent in all-reduce / all-gather (waiting for the other ranks included)."""
        return 100.0 * self._record(*params)["extra"]["all_reduce_share"]

    def track_moe_rank_imbalance(self, *params):
        """max/mean over ranks of the tokens routed to each rank's experts per step."""
        return self._record(*params)["extra"]["rank_imbalance"]["moe_tokens"]

    common.metric(track_tok_per_s, "tok/s", "higher")
    common.metric(track_all_reduce_share, "percent", "info")
    common.metric(track_moe_rank_imbalance, "ratio", "info")


def summary_line(record: dict) -> str:
    x = record["extra"]
    mem = max((r.get("peak_mem_gib", 0.0) for r in x["per_rank"]), default=0.0)
    return (f"{record['name']}: {record['median']:.1f} tok/s, all-reduce {100 * x['all_reduce_share']:.1f}% of the step, "
            f"MoE tokens imbalance across ranks {x['rank_imbalance']['moe_tokens']:.3f}, "
            f"MoE time imbalance {x['rank_imbalance']['moe_ms']:.3f}, peak memory per GPU {mem:.1f} GiB")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_tp", description=__doc__)
    p.add_argument("--tp", type=int, default=2, help="processes = GPUs")
    p.add_argument("--backends", default="cuda", help="comma-separated verify backends, e.g. cuda,triton_extend")
    p.add_argument("--contexts", default=",".join(map(str, W.CONTEXTS)), help="comma-separated contexts")
    p.add_argument("--out", type=Path, required=True, help="directory for the decode JSONs and samples.jsonl")
    args = p.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ran = 0
    for backend in args.backends.split(","):
        reason = unavailable_reason(args.tp, backend)
        if reason is not None:
            print(f"decode-tp{args.tp}/{backend}: skipped ({reason})", file=sys.stderr)
            continue
        for context in (int(c) for c in args.contexts.split(",")):
            print(summary_line(measure(args.tp, backend, context, args.out)), flush=True)
            ran += 1
    return 0 if ran else 2


if __name__ == "__main__":
    sys.exit(main())
