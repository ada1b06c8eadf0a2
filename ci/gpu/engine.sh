#!/usr/bin/env bash
# One device run for the decode engine (issue 13), measuring exactly a committed revision: run it from a
# clone of a git bundle made here (the tree the device tool sends is /work/main's, not the worktree's).
#
#   here:   mkdir -p /work/main/out/engine && git bundle create /work/main/out/engine/kd.bundle HEAD
#   device: rm -rf /tmp/kd && git clone -q out/engine/kd.bundle /tmp/kd && cd /tmp/kd && bash ci/gpu/engine.sh
#           (carry out/engine; kind nvidia-h200-x2 for the TP=2 part)
#
# Part A (GPU 0): `kdengine decode --config kimi-k2-tp8-rank --layers 8 --budget 63` at CTXS for each of
#   ROUTINGS (ci/gpu/engine_decode.py: profile with the ops timed under graph replay, step roofline);
#   meanwhile on GPU 1 (when there is one, else after) the engine's single-GPU tests.
# Part B (two GPUs): the same decode under torchrun with TP=2 (NCCL, CUDA graphs), then the 2-GPU test
#   (graph replay == eager tokens on both ranks).
# Env: BACKEND (verify backend, default triton), CTXS, ROUTINGS, TP_CTXS, STEPS, A_TIMEOUT, TP_TIMEOUT, TEST_TIMEOUT,
#      BUDGET_S (seconds for the whole script: the 2-GPU test, last, gets what is left).
# Output under $OUT: engine_run.json, tp2_run.json (fingerprint + decode results; rewritten after each
# run), engine.log, tp2.log, pytest_gpu.log.
set -o pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/kdengine-out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache TRITON_DEFAULT_FP_FUSION=1 PYTHONPATH=$PWD
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
echo "commit $(git rev-parse HEAD)"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit --format=csv
NG=$(nvidia-smi -L | wc -l)
CTXS=${CTXS:-"4096 65536 16384"}
TESTS=${TESTS:-"tests/engine/test_tree.py tests/engine/test_draft_attention.py tests/engine/test_fused_ops.py tests/engine/test_run_decode.py"}

run_tests() {
  timeout ${TEST_TIMEOUT:-110} python3 -m pytest -q -m gpu $TESTS -p no:cacheprovider 2>&1 | tee "$OUT/pytest_gpu.log" | tail -8
}

start=$(date +%s)
CUDA_VISIBLE_DEVICES=0 timeout ${A_TIMEOUT:-170} python3 ci/gpu/engine_decode.py --out "$OUT/engine_run.json" \
  --ctxs $CTXS --routings ${ROUTINGS:-random uniform} --backend "${BACKEND:-triton}" --steps "${STEPS:-32}" \
  > "$OUT/engine.log" 2>&1 &
A=$!
if [[ $NG -ge 2 ]]; then CUDA_VISIBLE_DEVICES=1 run_tests; fi
wait $A; echo "part A rc $? ($(( $(date +%s) - start )) s)"; cat "$OUT/engine.log" | grep -v Warning
[[ $NG -ge 2 ]] || run_tests

if [[ $NG -ge 2 ]]; then
  start=$(date +%s)
  NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT timeout ${TP_TIMEOUT:-110} torchrun --standalone --nproc-per-node 2 ci/gpu/engine_decode.py --tp 2 \
    --out "$OUT/tp2_run.json" --ctxs ${TP_CTXS:-$CTXS} --backend "${BACKEND:-triton}" --steps "${STEPS:-32}" \
    2>&1 | tee "$OUT/tp2.log" | grep -v "Warning\|NCCL INFO"
  grep -E "NCCL INFO (Channel 00|.*via|NCCL version)" "$OUT/tp2.log" | sort -u | head -8  # the transport the all-reduces use
  echo "part B rc $? ($(( $(date +%s) - start )) s)"
  left=$(( ${BUDGET_S:-240} - ($(date +%s) - T0) - 5 ))
  echo "2-GPU test: ${left} s left"
  [[ $left -gt 10 ]] && timeout $left python3 -m pytest -q -m gpu tests/engine/test_tp.py -k "${TP_TESTS:-nccl}" \
    -p no:cacheprovider 2>&1 | tee "$OUT/pytest_tp_gpu.log" | tail -5
fi
ls -la "$OUT"
