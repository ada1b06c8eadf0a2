#!/usr/bin/env bash
# One device run for the mma.sync path (issue 12, item 2): build for the local arch, the GPU tests of
# the wide2 layout (col_warps 16) and the merges, the kernel sweep's `mma` set (wide2 at several NSPLIT
# and merges beside the wide layout and FlashMLA: perf_history/kernel JSON), ncu of wide2 at 65k T=16
# and T=64 (split kernel + merge), compute-sanitizer memcheck + racecheck on wide2. Each step has its
# own time limit and writes straight into $OUT (a run cut at the tool's limit still returns its files).
#   usage: KDENGINE_COMMIT=<sha> bash ci/gpu/mma_path.sh [all|test|bench|ncu|sanitize|ncu-old]...
#   FlashMLA: the sgl-flash-mla wheel from $WHEELS or .whl/, when present.
set -o pipefail
OUT=${OUT:-/tmp/kdengine-mma-out}
mkdir -p "$OUT"
LOG=$OUT/run.log
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
STEPS=${*:-all}
status=0
want() { [[ " $STEPS " == *" all "* || " $STEPS " == *" $1 "* ]]; }
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)" | tee -a "$LOG"; }
NCU_SECTIONS=(--section SpeedOfLight --section Occupancy --section LaunchStats --section ComputeWorkloadAnalysis
              --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats)
NCU_KEYS="verify_|Duration|Compute \(SM\) Throughput|DRAM Throughput|Issue Slots Busy|Achieved Occupancy|Registers Per|Warp Cycles Per Issued|Stall|No Eligible|rel L2"

step info
$PY -m kdengine.ops.build --arch native > "$OUT/build.log" 2>&1 &
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
tail -2 "$OUT/build.log" | tee -a "$LOG"

if want test; then
  step test
  timeout 80 $PY -m pytest -q -m gpu tests/ops/test_cuda.py -p no:cacheprovider --maxfail=8 --durations=3 \
    -k "wide2 or both_merges or cuda_graph or cw16" 2>&1 | tail -30 | tee -a "$LOG" || status=1
fi

if want bench; then
  step bench
  timeout 120 $PY -m kdengine.bench.kernel measure --set mma --contexts 65536,16384,4096 --out "$OUT/verify_kernel.json" \
    --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee -a "$LOG" || status=1
fi

ncu_run() {  # ncu_run TAG T ARGS...
  local tag=$1 T=$2; shift 2
  timeout 35 ncu --clock-control none -k regex:verify_ --launch-count 2 "${NCU_SECTIONS[@]}" \
    $PY -m kdengine.bench.kernel once --T $T --prefix $((65536 - T)) "$@" > "$OUT/ncu_${tag}_T$T.txt" 2>&1
  grep -E "$NCU_KEYS" "$OUT/ncu_${tag}_T$T.txt" | head -60 | tee -a "$LOG"
}
if want ncu; then
  step ncu
  for T in 16 64; do ncu_run wide2 $T --col-warps 16 --combine 2; done
fi

if want sanitize; then
  step sanitize
  timeout 30 compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --B 3 --T 17 \
    --prefix 130 --col-warps 16 --combine 2 2>&1 | tail -4 | tee -a "$LOG" || status=1
  timeout 45 compute-sanitizer --tool racecheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --T 5 --H 8 \
    --prefix 40 --col-warps 16 --combine 2 2>&1 | tail -4 | tee -a "$LOG" || status=1
fi

if want ncu-old; then
  step "ncu, the wide layout (before)"
  ncu_run wide 16 --col-warps 8 --combine 1
fi
step "done status=$status"
exit $status
