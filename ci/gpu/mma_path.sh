#!/usr/bin/env bash
# One device run for the mma.sync path (issue 12, item 2): build for the local arch, the GPU tests of
# the wide2 layout (col_warps 16) and the merges, the kernel sweep's `mma` set (wide2 at several NSPLIT
# and merges beside the wide layout and FlashMLA: perf_history/kernel JSON), ncu of wide2 at 65k T=16
# and T=64 (split kernel + merge), compute-sanitizer memcheck + racecheck on wide2. Each step has its
# own time limit; logs are packed into $OUT/logs.tgz (the device tool returns at most 8 files).
#   usage: KDENGINE_COMMIT=<sha> bash ci/gpu/mma_path.sh [all|test|bench|ncu|sanitize]...
#   FlashMLA: the sgl-flash-mla wheel from $WHEELS (default out/mma) or .whl/, when present.
set -o pipefail
OUT=${OUT:-/tmp/kdengine-mma-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
STEPS=${*:-all}
status=0
want() { [[ " $STEPS " == *" all "* || " $STEPS " == *" $1 "* ]]; }
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)"; }

step info
wheels=$(ls ${WHEELS:-out/mma}/*.whl .whl/*.whl 2>/dev/null | head -1)
if [ -n "$wheels" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$wheels" 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv | tee "$LOG/smi.txt"

step build
$PY -m kdengine.ops.build --arch native 2>&1 | tail -3 | tee "$LOG/build.log" || status=1

if want test; then
  step test
  timeout 150 $PY -m pytest -q -m gpu tests/ops/test_cuda.py -p no:cacheprovider -x --durations=5 \
    -k "wide2 or both_merges or cuda_graph or (layout and 16)" 2>&1 | tail -25 | tee "$LOG/pytest_gpu.log" || status=1
fi

if want bench; then
  step bench
  timeout 200 $PY -m kdengine.bench.kernel measure --set mma --out "$OUT/verify_kernel.json" \
    --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench.log" || status=1
fi

if want ncu; then
  step ncu
  for T in 16 64; do
    timeout 60 ncu --clock-control none -k regex:verify_ --launch-count 2 --section SpeedOfLight --section Occupancy \
      --section LaunchStats --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
      --section WarpStateStats --section SchedulerStats \
      $PY -m kdengine.bench.kernel once --T $T --prefix $((65536 - T)) --col-warps 16 --combine 2 \
      > "$LOG/ncu_wide2_T$T.txt" 2>&1 || true
    grep -E "verify_|Duration|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall|No Eligible|rel L2" \
      "$LOG/ncu_wide2_T$T.txt" | head -40
  done
fi

if want sanitize; then
  step sanitize
  timeout 60 compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --B 3 --T 17 \
    --prefix 130 --col-warps 16 --combine 2 2>&1 | tail -6 | tee "$LOG/memcheck.log" || status=1
  timeout 90 compute-sanitizer --tool racecheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --T 5 --H 8 \
    --prefix 40 --col-warps 16 --combine 2 2>&1 | tail -6 | tee "$LOG/racecheck.log" || status=1
fi

tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
step "done status=$status"
exit $status
