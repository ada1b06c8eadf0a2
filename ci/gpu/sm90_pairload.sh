#!/usr/bin/env bash
# One device run for the sm90 pair schedule's load/release rework: build (ptxas report and SASS counts
# alongside), smoke calls of every pair variant (a wrong or hanging kernel gets the localising diagnostic
# and the run ends there), then alone on the GPU the timing set `pairload` (staggered, the first pair loop
# pair_v0, pair, its L2-prefetch variants and staggered with the prefetch, FlashMLA at the six sizes) and ncu
# of pair_v0, pair and pair_pf2 at
# 65k T=64, then at once the GPU tests of both cuda paths, compute-sanitizer memcheck of pair and racecheck
# of pair on three shapes (pair_v0 beside it as the control). Every step is cut by `timeout`, capped so
# that the run ends by $DEADLINE seconds (the log tarball is written in any case); everything lands in
# $OUT (the JSON and one log tarball).
#   usage: KDENGINE_COMMIT=<sha> SM90_WHL=<sgl_flash_mla wheel> DEADLINE=240 [STEPS="smoke bench ncu checks"]
#          bash ci/gpu/sm90_pairload.sh
set -o pipefail
OUT=${OUT:-/tmp/kdengine-pairload-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
status=0
DEADLINE=${DEADLINE:-240}
STEPS=${STEPS:-"smoke bench ncu checks"}
SET=${SET:-pairload}
want() { [[ " $STEPS " == *" $1 "* ]]; }
cap() { local left=$((DEADLINE - SECONDS)); echo $(( left < $1 ? (left > 5 ? left : 5) : $1 )); }  # step limit
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)"; }
finish() {
  tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
  step "done status=$status"
  exit $status
}

step info
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOG/smi.txt"
if [ -n "${SM90_WHL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$SM90_WHL" 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
fi

step build
( nvcc -std=c++17 -O3 -lineinfo -Xptxas -v -gencode=arch=compute_90a,code=sm_90a -c csrc/verify_sm90.cu \
    -o /tmp/verify_sm90.o > "$LOG/ptxas.txt" 2>&1 && cuobjdump -sass /tmp/verify_sm90.o > "$LOG/verify_sm90.sass" 2>&1 ) &
ptxas_pid=$!
timeout $(cap 240) $PY -m kdengine.ops.build --arch native 2>&1 | tail -5 | tee "$LOG/build.log" \
  || { status=1; finish; }

if want smoke; then
  step smoke
  i=0
  for args in "sm90_pair --T 1 --H 1 --prefix 63" "sm90_pair --T 64 --prefix 700 --B 2" "sm90_pair --T 16 --prefix 4000" \
      "sm90_pair --T 33 --H 2 --prefix 900 --nsplit 1" "sm90_pair --T 17 --H 4 --prefix 150 --nsplit 1" \
      "sm90_pair_pf2 --T 64 --prefix 3000" "sm90_pair_pf4 --T 64 --prefix 3000 --B 2" "sm90_pair_v0 --T 64 --prefix 700" \
      "sm90_staggered_pf2 --T 16 --prefix 3000"; do
    timeout $(cap 40) $PY -m kdengine.bench.kernel once --path $args > "$LOG/smoke$i.log" 2>&1 &
    pids[$i]=$!
    i=$((i + 1))
  done
  smoke_ok=1
  for j in "${!pids[@]}"; do
    wait "${pids[$j]}" || smoke_ok=0
    echo "$(tail -1 "$LOG/smoke$j.log")"
  done
  if [ $smoke_ok = 0 ]; then
    status=1
    timeout $(cap 90) $PY ci/gpu/sm90_diag.py 2>&1 | tee "$LOG/diag.log" | grep -E "^pair|^staggered" | head -60
    finish
  fi
fi

if want bench; then
  step bench
  timeout $(cap 120) $PY -m kdengine.bench.kernel measure --set $SET --out "$OUT/verify_kernel_$SET.json" \
    --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench.log" | grep -E "ctx|ceiling" || status=1
fi

if want ncu; then
  step ncu  # the report is kept (logs.tgz); details and the raw page (stall reasons) printed from it
  for sched in ${NCU_SCHEDULES:-pair_v0 pair pair_pf2}; do
    rep="$LOG/ncu_${sched}_T64"
    timeout $(cap 60) ncu --clock-control none -k regex:verify_sm90 --launch-count 1 --section SpeedOfLight \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats \
      --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_gmma.avg.pct_of_peak_sustained_active \
      --export "$rep" --force-overwrite \
      $PY -m kdengine.bench.kernel once --path sm90_$sched --T 64 --prefix $((65536 - 64)) > "$rep.log" 2>&1 || true
    ncu --import "$rep.ncu-rep" > "$rep.txt" 2>&1
    ncu --import "$rep.ncu-rep" --page raw > "$rep.raw.txt" 2>&1
    echo "--- ncu sm90_$sched 65k T=64"
    grep -E "Duration|Compute \(SM\)|DRAM Throughput|L2 Cache Throughput|Issue Slots Busy|Issued Ipc|No Eligible|Warp Cycles Per Issued|gmma" \
      "$rep.txt" | head -14
    grep -E "issue_stalled_(long_scoreboard|barrier|no_instruction|wait|math_pipe_throttle|short_scoreboard|sleeping|dispatch_stall|membar|branch_resolving|lg_throttle|mio_throttle|selected|not_selected)_per_warp_active.pct " "$rep.raw.txt" | head -24
  done
fi

if want checks; then
  step checks  # correctness, all at once: tests of both paths, the sanitizers
  timeout $(cap 170) $PY -m pytest -q -m gpu tests/ops/test_sm90.py -p no:cacheprovider > "$LOG/pytest_sm90.log" 2>&1 &
  t1=$!
  timeout $(cap 170) $PY -m pytest -q -m gpu tests/ops/test_cuda.py -k "matches_reference or graph or verify_attention" \
    -p no:cacheprovider > "$LOG/pytest_cuda.log" 2>&1 &
  t2=$!
  san=()
  i=0
  for spec in "memcheck sm90_pair --B 3 --T 17 --prefix 130" "racecheck sm90_pair --T 3 --H 2 --prefix 140" \
      "racecheck sm90_pair --T 64 --prefix 700 --nsplit 4" "racecheck sm90_pair --B 3 --T 17 --prefix 130" \
      "racecheck sm90_pair --T 3 --H 2 --prefix 300 --nsplit 1" "racecheck sm90_pair_v0 --T 3 --H 2 --prefix 140"; do
    set -- $spec
    tool=$1; shift
    timeout $(cap 150) compute-sanitizer --tool $tool --error-exitcode 9 $PY -m kdengine.bench.kernel once --path "$@" \
      > "$LOG/san$i.log" 2>&1 &
    san[$i]=$!
    echo "$spec" > "$LOG/san$i.spec"
    i=$((i + 1))
  done
  checks_ok=1
  for pid in $t1 $t2; do wait $pid || checks_ok=0; done
  for f in pytest_sm90 pytest_cuda; do echo "--- $f"; grep -E "passed|failed|FAILED|Error" "$LOG/$f.log" | head -20; done
  for j in "${!san[@]}"; do
    wait "${san[$j]}"; rc=$?
    echo "--- $(cat "$LOG/san$j.spec") rc=$rc"
    grep -E "Race reported|RACECHECK SUMMARY|ERROR SUMMARY|rel L2|Error" "$LOG/san$j.log" | head -6
    [ $rc = 0 ] || [[ "$(cat "$LOG/san$j.spec")" == *pair_v0* ]] || status=1
  done
  if [ $checks_ok = 0 ]; then status=1; fi
fi
wait $ptxas_pid
grep -E "registers|spill|C75" "$LOG/ptxas.txt"
grep -oE "HGMMA[.A-Za-z0-9_]*|WARPGROUP[.A-Za-z0-9_]*|LDL|STL" "$LOG/verify_sm90.sass" | sort | uniq -c
finish
