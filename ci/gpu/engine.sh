#!/usr/bin/env bash
# One device run for the decode engine (issue 13), measuring exactly a committed revision (cloned from a
# git bundle made here, like session.sh): the engine's GPU tests (tree + mask kernel, drafter split-KV
# attention, graph == eager tokens), the tree + mask kernel isolated (graph-replayed, budget 63, top-8,
# depth 16; the torch path it replaced timed beside it), and `kdengine decode --config kimi-k2-tp8-rank
# --layers 8 --budget 63 --steps 32` at 4k/16k/65k (run in-process: run_decode with those settings) with
# the per-phase and per-op profile and the step roofline.
#
#   here:   mkdir -p out/engine_run && git bundle create out/engine_run/kdengine.bundle HEAD
#   device: bash ci/gpu/engine.sh            (carry out/engine_run)
# Env: BACKEND (verify backend, default triton: no csrc build inside the device limit), CTXS, STEPS,
#      TESTS (pytest paths), TEST_TIMEOUT, DECODE_TIMEOUT (seconds for the two parts).
# Output under $OUT: engine_run.json (fingerprint, tree timing, decode results; rewritten after each
# part, so a run cut short still returns what it measured), engine.log, pytest_gpu.log.
set -o pipefail
OUT=${OUT:-/tmp/kdengine-out}; mkdir -p "$OUT"
SRC=$PWD; KD=/tmp/kd-engine
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache TRITON_DEFAULT_FP_FUSION=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
rm -rf "$KD" && git clone -q "$SRC/out/engine_run/kdengine.bundle" "$KD" || { echo "clone of the bundle failed"; exit 1; }
cd "$KD" || exit 1
export PYTHONPATH=$KD
echo "commit $(git rev-parse HEAD)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv

timeout ${TEST_TIMEOUT:-75} python3 -m pytest -q -m gpu ${TESTS:-tests/engine/test_tree.py tests/engine/test_draft_attention.py \
  tests/engine/test_fused_ops.py tests/engine/test_run_decode.py} -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -8

BACKEND=${BACKEND:-triton} CTXS=${CTXS:-"4096 65536 16384"} STEPS=${STEPS:-32} timeout ${DECODE_TIMEOUT:-150} python3 - "$OUT" <<'PY' 2>&1 | tee "$OUT/engine.log"
import json, os, sys, gc
import torch
from kdengine.bench import fingerprint, timer, workloads
from kdengine.engine.generate import DecodeSettings, run_decode
from kdengine.engine.tree import build_masks, build_tree_device
from kdengine.ops.mask import pack_tree_mask

out = os.path.join(sys.argv[1], "engine_run.json")
report = {"fingerprint": {**fingerprint.collect(), "machine": fingerprint.machine_name(), "clocks": fingerprint.clocks()},
          "tree": {}, "decode": {}}
def save():
    json.dump(report, open(out, "w"), indent=1, default=str)

rec = workloads.measure(workloads.find("tree/device/budget63"), write=False)
report["tree"]["kernel"] = {"name": rec["name"], "median_s": rec["median"], "samples": rec["samples"], "extra": rec["extra"]}
gen = torch.Generator().manual_seed(0)
lp = torch.randn(1, 16, 8, generator=gen).log_softmax(-1).sort(-1, descending=True).values.cuda()
ids = torch.randint(0, 32000, (1, 16, 8), generator=gen).cuda()
root = torch.zeros(1, dtype=torch.int64, device="cuda")
def torch_path(_i=0):
    t = build_tree_device(lp, ids, 63, root_token=root, with_mask=False)
    return pack_tree_mask(build_masks(t.parents))
m = timer.time_gpu(torch_path, samples=20, warmup=3, launches=8, use_graph=True)
report["tree"]["torch_path"] = {"median_s": m.median, "samples": m.samples}
print(f"tree+mask budget 63: kernel {1e3 * rec['median']:.4f} ms, torch path {1e3 * m.median:.4f} ms", flush=True)
save()

for ctx in [int(c) for c in os.environ["CTXS"].split()]:
    s = DecodeSettings(config="kimi-k2-tp8-rank", layers=8, context=ctx, budget=63, backend=os.environ["BACKEND"],
                       steps=int(os.environ["STEPS"]), device="cuda")
    r = run_decode(s)
    d = r.to_dict()
    report["decode"][str(ctx)] = d
    ph = " ".join(f"{k}={v:.3f}" for k, v in r.phase_ms.items())
    ops = " ".join(f"{k}={v:.3f}" for k, v in r.op_ms.items())
    print(f"ctx {ctx}: {r.tok_per_s:.1f} tok/s, step {d['mean_step_ms']:.3f} ms, floor {r.floor_ms:.3f} ms "
          f"({d['step_over_floor']:.2f}x), graphs {r.cuda_graphs_used}\n  phases {ph}\n  ops {ops}\n  bytes {r.step_bytes}", flush=True)
    save()
    del r
    gc.collect()
    torch.cuda.empty_cache()
report["fingerprint"]["clocks_end"] = fingerprint.clocks()
save()
PY
ls -la "$OUT"
