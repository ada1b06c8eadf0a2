#!/usr/bin/env bash
# One device run for the mma.sync path (issue 12, item 2): build for the local arch, the GPU tests of
# the wide2 layouts (col_warps 16 and 32) and the merges, the kernel sweep's `mma` set (wide2 at several
# NSPLIT and merges beside the wide layout and FlashMLA: perf_history/kernel JSON), ncu at 65k T=16 and
# T=64 (split kernel + merge, with the stall breakdown), compute-sanitizer memcheck + racecheck. Each
# step has its own time limit and writes straight into $OUT (a run cut at the tool's limit still
# returns its files); the ncu reports go into $OUT/ncu.tgz, refreshed after each (the device tool
# returns at most 8 files).
#   usage: KDENGINE_COMMIT=<sha> bash ci/gpu/mma_path.sh [all|test|bench|ncu|sanitize]...
#   NCU="cw:combine:pingpong:T ..." and SAN="cw:combine:pingpong ..." pick the layouts profiled / checked.
#   FlashMLA: the sgl-flash-mla wheel from $WHEELS or .whl/, when present.
set -o pipefail
OUT=${OUT:-/tmp/kdengine-mma-out}
NCU_DIR=/tmp/kdengine-mma-ncu
mkdir -p "$OUT" "$NCU_DIR"
LOG=$OUT/run.log
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
STEPS=${*:-all}
NCU=${NCU:-"32:2:0:16 32:2:0:64 16:2:1:16 16:2:1:64 8:1:0:16"}
SAN=${SAN:-"32:2:0 16:2:1"}
status=0
want() { [[ " $STEPS " == *" all "* || " $STEPS " == *" $1 "* ]]; }
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)" | tee -a "$LOG"; }
STALLS=$(for r in wait short_scoreboard long_scoreboard barrier math_pipe_throttle mio_throttle dispatch_stall \
          not_selected selected no_instruction branch_resolving lg_throttle; do
          printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' $r; done)
NCU_SECTIONS=(--section SpeedOfLight --section Occupancy --section WarpStateStats)
NCU_METRICS=(--metrics "${STALLS}sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum")
NCU_KEYS="verify_|Duration|DRAM Throughput|Issue Slots Busy|issue_active|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|stalled|tensor_op|bank_conflicts|rel L2"

step info
$PY -m kdengine.ops.build --arch native > /tmp/kdengine-mma-build.log 2>&1 &
build_pid=$!
wheel=$(ls ${WHEELS:-.whl}/*.whl 2>/dev/null | head -1)
if [ -n "$wheel" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$wheel" 2>&1 | tail -2 | tee -a "$LOG"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee -a "$LOG"
wait $build_pid || status=1
step "built"
tail -2 /tmp/kdengine-mma-build.log | tee -a "$LOG"

if want test; then
  step test
  timeout 60 $PY -m pytest -q -m gpu tests/ops/test_cuda.py -p no:cacheprovider --maxfail=8 --durations=3 \
    -k "wide2 or cw8 or cw16 or cw32" 2>&1 | tail -30 | tee -a "$LOG" || status=1
fi

if want bench; then
  step bench
  timeout 60 $PY -m kdengine.bench.kernel measure --set mma --contexts 65536,16384,4096 --out "$OUT/verify_kernel.json" \
    --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee -a "$LOG" || status=1
fi

if want ncu; then
  step ncu
  for spec in $NCU; do
    IFS=: read -r cw comb pp T <<< "$spec"
    f="$NCU_DIR/ncu_cw${cw}_comb${comb}_pp${pp}_T$T.txt"
    once=($PY -m kdengine.bench.kernel once --T $T --prefix $((65536 - T)) --col-warps $cw --combine $comb --pingpong $pp)
    timeout 25 ncu --clock-control none -k regex:verify_ --launch-count 2 "${NCU_SECTIONS[@]}" "${NCU_METRICS[@]}" \
      "${once[@]}" > "$f" 2>&1
    if grep -q "==ERROR==" "$f"; then  # a metric this ncu does not know: the sections alone
      grep "==ERROR==" "$f" | head -3 | tee -a "$LOG"
      NCU_METRICS=()
      timeout 25 ncu --clock-control none -k regex:verify_ --launch-count 2 "${NCU_SECTIONS[@]}" "${once[@]}" > "$f" 2>&1
    fi
    echo "--- ncu cw$cw comb$comb pp$pp T$T" | tee -a "$LOG"
    grep -E "$NCU_KEYS" "$f" | grep -v "^==PROF" | head -40 | tee -a "$LOG"
    tar czf "$OUT/ncu.tgz" -C "$NCU_DIR" .
  done
fi

if want ncu; then  # the merge alone with the L2 as the split kernel left it (partials resident), as in a replay
  for T in 16 64; do
    cw=${NCU%%:*}
    timeout 20 ncu --clock-control none --cache-control none -k regex:verify_combine --launch-count 3 \
      --section SpeedOfLight $PY -m kdengine.bench.kernel once --T $T --prefix $((65536 - T)) --col-warps $cw \
      --combine 2 --pingpong 0 > "$NCU_DIR/ncu_merge_warm_T$T.txt" 2>&1
    echo "--- ncu merge, warm L2, cw$cw T$T" | tee -a "$LOG"
    grep -E "verify_|Duration|DRAM Throughput" "$NCU_DIR/ncu_merge_warm_T$T.txt" | grep -v "^==PROF" | tee -a "$LOG"
    tar czf "$OUT/ncu.tgz" -C "$NCU_DIR" .
  done
fi

if want sanitize; then
  step sanitize
  for spec in $SAN; do
    IFS=: read -r cw comb pp <<< "$spec"
    echo "--- sanitize cw$cw comb$comb pp$pp" | tee -a "$LOG"
    timeout 25 compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --B 3 --T 17 \
      --prefix 130 --col-warps $cw --combine $comb --pingpong $pp 2>&1 | tail -3 | tee -a "$LOG" || status=1
    timeout 35 compute-sanitizer --tool racecheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --T 5 --H 8 \
      --prefix 40 --col-warps $cw --combine $comb --pingpong $pp 2>&1 | tail -3 | tee -a "$LOG" || status=1
  done
fi
step "done status=$status"
exit $status
