#!/usr/bin/env bash
# One device run for the instruction-fetch question of the sm90 kernel (is no_instruction, the top stall of
# staggered at 65k T=16, the hot loop's code size?): build for the local arch (ptxas report; SASS counts of
# the kernels and their loops by ci/gpu/sass_loops.py), smoke calls of the two smaller-loop variants
# (staggered_small, staggered_tail), then alone on the GPU the timing set `icache` (staggered, the variants,
# staggered again as the A/A control, FlashMLA at the six sizes) and ncu of staggered and the variants at
# 65k T=16 (stalls per issue, tensor pipe, issue slots; SourceCounters per SASS line), then at once the
# staggered GPU tests of tests/ops/test_sm90.py and compute-sanitizer racecheck of both variants (memcheck
# of staggered_small) on one small shape. Every step is cut by `timeout`, capped so that the run ends by
# $DEADLINE seconds (the log tarball is written in any case); everything lands in $OUT.
#   usage: KDENGINE_COMMIT=<sha> SM90_WHL=<sgl_flash_mla wheel> DEADLINE=120 bash ci/gpu/sm90_icache.sh
set -o pipefail
OUT=${OUT:-/tmp/kdengine-icache-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
status=0
DEADLINE=${DEADLINE:-120}
NCU=${NCU:-"staggered staggered_small staggered_tail"}
VARIANTS="staggered_small staggered_tail"
cap() { local left=$((DEADLINE - SECONDS)); echo $(( left < $1 ? (left > 5 ? left : 5) : $1 )); }  # step limit
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)"; }
finish() {
  tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
  step "done status=$status"
  exit $status
}
STALLS=$(for r in wait long_scoreboard short_scoreboard barrier gmma math_pipe_throttle mio_throttle dispatch_stall \
          not_selected selected no_instruction branch_resolving lg_throttle sleeping membar; do
          printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' $r; done)
NCU_METRICS="${STALLS}sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
smsp__issue_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,\
gpu__time_duration.sum,smsp__inst_executed.sum"

step info
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOG/smi.txt"
if [ -n "${SM90_WHL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $SM90_WHL 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
fi

step build
( nvcc -std=c++17 -O3 -lineinfo -Xptxas -v -gencode=arch=compute_90a,code=sm_90a -c csrc/verify_sm90.cu \
    -o /tmp/verify_sm90.o > "$LOG/ptxas.txt" 2>&1 && cuobjdump -sass /tmp/verify_sm90.o > "$LOG/verify_sm90.sass" 2>&1 \
    && $PY ci/gpu/sass_loops.py "$LOG/verify_sm90.sass" 'kernelILi[256]E' > "$LOG/sass_loops.txt" 2>&1 ) &
ptxas_pid=$!
timeout $(cap 70) $PY -m kdengine.ops.build --arch native 2>&1 | tail -5 | tee "$LOG/build.log" || { status=1; finish; }

step smoke
i=0
for path in $VARIANTS; do
  for args in "--T 1 --H 1 --prefix 63" "--T 64 --prefix 700 --B 2" "--T 17 --H 4 --prefix 150 --nsplit 1"; do
    timeout $(cap 30) $PY -m kdengine.bench.kernel once --path sm90_$path $args > "$LOG/smoke$i.log" 2>&1 &
    pids[$i]=$!
    i=$((i + 1))
  done
done
smoke_ok=1
for j in "${!pids[@]}"; do
  wait "${pids[$j]}" || smoke_ok=0
  tail -1 "$LOG/smoke$j.log"
done
if [ $smoke_ok = 0 ]; then
  status=1
  for j in "${!pids[@]}"; do tail -3 "$LOG/smoke$j.log"; done
  finish
fi

step bench
timeout $(cap 40) $PY -m kdengine.bench.kernel measure --set icache --out "$OUT/verify_kernel_icache.json" \
  --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench.log" | grep -E "ctx|ceiling" || status=1

step ncu  # one launch of the split kernel each (cold L2), per-SASS-line source counters kept in logs.tgz
for sched in $NCU; do
  [ $((DEADLINE - SECONDS)) -gt 45 ] || { echo "--- ncu $sched skipped (time)"; continue; }
  rep="$LOG/ncu_${sched}_T16"
  timeout $(cap 25) ncu --clock-control none -k regex:verify_sm90 --launch-count 1 --import-source yes \
    --section SpeedOfLight --section WarpStateStats --section SourceCounters --metrics "$NCU_METRICS" \
    --export "$rep" --force-overwrite \
    $PY -m kdengine.bench.kernel once --path sm90_$sched --T 16 --prefix $((65536 - 16)) > "$rep.log" 2>&1 || true
  ncu --import "$rep.ncu-rep" --page raw > "$rep.raw.txt" 2>&1
  ncu --import "$rep.ncu-rep" > "$rep.txt" 2>&1
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
  echo "--- ncu sm90_$sched 65k T=16"
  grep -E "(sm__pipe_tensor_op_hmma_cycles_active|smsp__issue_active|sm__warps_active)\.avg|gpu__time_duration.sum|smsp__inst_executed.sum" \
    "$rep.raw.txt"
  grep -E "issue_stalled_[a-z_]+_per_issue_active.ratio" "$rep.raw.txt" | awk '$NF + 0 >= 0.05' | head -16
  $PY ci/gpu/ncu_source_top.py "$rep.sass.csv" 30 > "$rep.sass.top.txt" 2>&1
  head -12 "$rep.sass.top.txt"
  gzip -f "$rep.sass.csv"
done

step checks  # correctness, all at once: the staggered GPU tests, racecheck of both variants, memcheck of one
timeout $(cap 60) $PY -m pytest -q -m gpu -k staggered tests/ops/test_sm90.py -p no:cacheprovider > "$LOG/pytest_sm90.log" 2>&1 &
t1=$!
san=()
i=0
for spec in "racecheck staggered_small" "racecheck staggered_tail" "memcheck staggered_small"; do
  read -r tool path <<< "$spec"
  timeout $(cap 60) compute-sanitizer --tool $tool --error-exitcode 9 $PY -m kdengine.bench.kernel once --path sm90_$path \
    --T 64 --prefix 700 --nsplit 4 > "$LOG/san$i.log" 2>&1 &
  san[$i]=$!
  echo "$spec --T 64 --prefix 700 --nsplit 4" > "$LOG/san$i.spec"
  i=$((i + 1))
done
checks_ok=1
wait $t1 || checks_ok=0
echo "--- pytest_sm90 -k staggered"; grep -E "passed|failed|FAILED|Error" "$LOG/pytest_sm90.log" | head -20
for j in "${!san[@]}"; do
  wait "${san[$j]}"
  rc=$?
  [ $rc = 0 ] || status=1
  echo "--- $(cat "$LOG/san$j.spec") rc=$rc"
  grep -E "Race reported|and (Read|Write) access|RACECHECK SUMMARY|ERROR SUMMARY|rel L2|Invalid|out of bounds" "$LOG/san$j.log" | head -8
done
wait $ptxas_pid
grep -E "registers|spill|C75" "$LOG/ptxas.txt"
grep -E "instructions \(|HGMMA 40" "$LOG/sass_loops.txt" | head -24
if [ $checks_ok = 0 ]; then status=1; fi

finish
