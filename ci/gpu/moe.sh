#!/usr/bin/env bash
# One device call for the INT4 MoE work (issue 15): GPU tests of the W4A16 kernel, its microbenchmark
# against the bf16 grouped path (kdengine.ops.moe_w4a16 bench: CUDA graph, L2 flushed, median of 30),
# then the full 61-layer kimi-k2-tp8-rank decode with INT4 experts under uniform routing at 4k/65k/16k
# (graphs on, budget 63, replay mean 5). Each stage writes under $OUT as it finishes, so a timeout keeps
# what ran. Usage (device): SHA=<commit> bash ci/gpu/moe.sh [STEPS]
set -o pipefail
OUT=${OUT:-/tmp/moe-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache PYTHONPATH=$PWD
SHA=${SHA:-unknown}; STEPS=${1:-10}
LOG=$OUT/moe.log  # one log (the device returns at most 8 files): this, the bench JSON, three decode JSONs
step() { echo "=== $1 ($(date -u +%T))" | tee -a "$LOG"; }
step env
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,memory.total --format=csv | tee -a "$LOG"
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" | tee -a "$LOG"
step tests
timeout 40 python3 -m pytest -q -m gpu tests/ops/test_moe_w4a16.py -p no:cacheprovider 2>&1 | tail -15 | tee -a "$LOG"
step bench
timeout 70 python3 -m kdengine.ops.moe_w4a16 --samples 20 --json "$OUT/moe_w4a16_$SHA.json" 2>&1 | tail -12 | tee -a "$LOG"
for ctx in 4096 65536 16384; do
  step "decode ctx $ctx"
  timeout 55 python3 -c "from kdengine.cli import main; raise SystemExit(main(['decode', '--config', 'kimi-k2-tp8-rank', \
    '--layers', '61', '--weights', 'int4', '--routing', 'uniform', '--backend', 'triton', '--context', '$ctx', \
    '--steps', '$STEPS', '--warmup-steps', '1', '--json', '$OUT/decode_int4_l61_ctx${ctx}_$SHA.json']))" 2>&1 \
    | grep -v "^\s*$" | tail -45 >> "$LOG"; tail -2 "$LOG"
done
step done
