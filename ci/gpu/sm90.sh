#!/usr/bin/env bash
# Device run for the Hopper verify kernel (issue 12 item 1): build for the local arch, a smoke call of
# each schedule (hangs cut short), the localising diagnostic, the GPU tests of both paths, the timing
# set `sm90` (mma.sync default, the sm90 schedules, FlashMLA) at the six sizes, ncu of the sm90
# kernel at 65k T=16 / T=64, compute-sanitizer memcheck + racecheck, ptxas / SASS counts. Everything
# lands in $OUT (at most 8 files; logs in one tarball).
#   usage: KDENGINE_COMMIT=<sha> bash ci/gpu/sm90.sh [steps...]   (steps: all or any of the names below)
set -o pipefail
OUT=${OUT:-/tmp/kdengine-sm90-out}
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
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOG/smi.txt"
WHL=${SM90_WHL:-$(ls .whl/sgl_flash_mla*.whl 2>/dev/null | head -1)}
if [ -n "$WHL" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$WHL" 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
fi

step build
if want probe; then
  ( nvcc -std=c++17 -O3 -gencode=arch=compute_90a,code=sm_90a -I csrc ci/gpu/sm90_probe.cu -o /tmp/sm90_probe \
      > "$LOG/probe_build.log" 2>&1 && timeout 30 /tmp/sm90_probe > "$LOG/probe.log" 2>&1 ) &
  probe_pid=$!
fi
timeout 200 $PY -m kdengine.ops.build --arch native 2>&1 | tail -5 | tee "$LOG/build.log" || { status=1; }
if want probe; then
  wait $probe_pid
  cat "$LOG/probe_build.log" | head -5
  cat "$LOG/probe.log"
fi

if want ptxas; then
  step ptxas
  nvcc -std=c++17 -O3 -lineinfo -Xptxas -v -gencode=arch=compute_90a,code=sm_90a -c csrc/verify_sm90.cu \
    -o /tmp/verify_sm90.o > "$LOG/ptxas.txt" 2>&1
  grep -E "registers|spill|C7514" "$LOG/ptxas.txt"
  cuobjdump -sass /tmp/verify_sm90.o > "$LOG/verify_sm90.sass" 2>&1
  grep -oE "HGMMA[.A-Za-z0-9_]*|UTMALDG[.A-Za-z0-9_]*|USETMAXREG[.A-Za-z0-9_]*|SYNCS[.A-Za-z0-9_]*|WARPGROUP[.A-Za-z0-9_]*|LDL|STL" \
    "$LOG/verify_sm90.sass" | sort | uniq -c | tee "$LOG/sass_counts.txt"
fi

# The smoke calls decide the rest: a wrong or hanging kernel gets the localising diagnostic and the run
# ends there (no device time on timing a wrong kernel).
smoke_ok=1
if want smoke; then
  step smoke
  for path in sm90_both sm90_staggered sm90_seesaw sm90_pair; do
    for args in "--T 1 --H 1 --prefix 63" "--T 16 --prefix 4000" "--T 64 --prefix 700 --B 2"; do
      timeout 25 $PY -m kdengine.bench.kernel once --path $path $args 2>&1 | tail -1 || { smoke_ok=0; status=1; }
    done
  done
  if [ $smoke_ok = 0 ]; then
    timeout 90 $PY ci/gpu/sm90_diag.py 2>&1 | tee "$LOG/diag.log" | tail -50
    STEPS="none"  # a wrong kernel: nothing more to learn from timing it
  fi
fi

if want test; then
  step test
  timeout 90 $PY -m pytest -q -m gpu tests/ops/test_sm90.py -p no:cacheprovider 2>&1 | tee "$LOG/pytest_sm90.log" \
    | grep -E "passed|failed|FAILED|Error" | head -40 || status=1
fi

if want bench; then
  step bench
  timeout 90 $PY -m kdengine.bench.kernel measure --set sm90 --out "$OUT/verify_kernel_sm90.json" \
    --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench.log" | grep -E "ctx|ceiling" || status=1
fi

if want ncu; then
  step ncu
  for run in both:16 both:64 staggered:16 staggered:64; do
    sched=${run%:*} T=${run#*:}
    timeout 30 ncu --clock-control none -k regex:verify_sm90 --launch-count 1 --section SpeedOfLight \
      --section Occupancy --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section SchedulerStats --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active \
      $PY -m kdengine.bench.kernel once --path sm90_$sched --T $T --prefix $((65536 - T)) > "$LOG/ncu_${sched}_T$T.txt" 2>&1 || true
    echo "--- ncu sm90_$sched 65k T=$T"
    grep -E "Duration|Compute \(SM\)|DRAM Throughput|L2 Cache Throughput|L2 Hit|Issue Slots|Warp Cycles Per Issued|Achieved Active Warps|hmma_cycles|stalled|Stall" "$LOG/ncu_${sched}_T$T.txt" | head -14
  done
fi

if want sanitize; then
  step sanitize
  for path in sm90_both sm90_staggered sm90_seesaw sm90_pair; do
    timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --path $path \
      --B 3 --T 17 --prefix 130 2>&1 | tail -3 | tee -a "$LOG/memcheck.log" || status=1
  done
  for path in sm90_both sm90_staggered sm90_seesaw sm90_pair; do  # seesaw: bar.arrive / bar.sync hand-offs
    timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --path $path \
      --T 3 --H 2 --prefix 140 2>&1 | tail -4 | tee -a "$LOG/racecheck.log" || status=1
  done
fi

if want mmatest; then
  step mmatest
  timeout 90 $PY -m pytest -q -m gpu tests/ops/test_cuda.py -k "matches_reference or graph or verify_attention" \
    -p no:cacheprovider 2>&1 | tail -3 | tee "$LOG/pytest_cuda.log" || status=1
fi

tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
step "done status=$status"
exit $status
