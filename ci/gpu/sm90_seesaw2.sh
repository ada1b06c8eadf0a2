#!/usr/bin/env bash
# One device run for the sm90 kernel's seesaw2 schedule (FlashMLA's order in our layout: per step warpgroup
# 0 computes S of the even tile, 1 of the odd one, no duplicated Q K^T, no producer warpgroup): build for the
# local arch (ptxas report, SASS counts and loop sizes alongside), smoke calls of seesaw2 on odd shapes (a
# wrong or hanging kernel gets the localising diagnostic and the run ends there), then alone on the GPU the
# timing set `seesaw2` (staggered_small, seesaw2, staggered_small again as the A/A control, FlashMLA at the
# six sizes) and ncu at 65k of seesaw2 (T=64, T=16) and staggered_small (T=64) (tensor pipe, issue slots,
# stalls per issue), then at once the seesaw2 GPU tests of tests/ops/test_sm90.py and compute-sanitizer
# racecheck + memcheck of seesaw2 on three small shapes. Every step is cut by `timeout`, capped so that the
# run ends by $DEADLINE seconds (the log tarball is written in any case); everything lands in $OUT.
#   usage: KDENGINE_COMMIT=<sha> SM90_WHL=<sgl_flash_mla wheel> DEADLINE=200 bash ci/gpu/sm90_seesaw2.sh
set -o pipefail
OUT=${OUT:-/tmp/kdengine-seesaw2-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
status=0
DEADLINE=${DEADLINE:-200}
NCU=${NCU:-"seesaw2:64 seesaw2:16"}
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
dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum,gpu__time_duration.sum,smsp__inst_executed.sum,\
l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum"

step info
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOG/smi.txt"
if [ -n "${SM90_WHL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $SM90_WHL 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
fi

step build
( nvcc -std=c++17 -O3 -lineinfo -Xptxas -v -gencode=arch=compute_90a,code=sm_90a -c csrc/verify_sm90.cu \
    -o /tmp/verify_sm90.o > "$LOG/ptxas.txt" 2>&1 && cuobjdump -sass /tmp/verify_sm90.o > "$LOG/verify_sm90.sass" 2>&1 \
    && $PY ci/gpu/sass_loops.py "$LOG/verify_sm90.sass" 'kernelILi[57]E' > "$LOG/sass_loops.txt" 2>&1 ) &
ptxas_pid=$!
timeout $(cap 90) $PY -m kdengine.ops.build --arch native 2>&1 | tail -5 | tee "$LOG/build.log" || { status=1; finish; }

step smoke
i=0
for args in "--T 1 --H 1 --prefix 63" "--T 64 --prefix 700 --B 2" "--T 16 --prefix 4000" "--T 33 --H 2 --prefix 900 --nsplit 1" \
    "--T 17 --H 4 --prefix 150 --nsplit 1" "--T 64 --prefix 3000 --H 16"; do
  timeout $(cap 30) $PY -m kdengine.bench.kernel once --path sm90_seesaw2 $args > "$LOG/smoke$i.log" 2>&1 &
  pids[$i]=$!
  i=$((i + 1))
done
smoke_ok=1
hung=0
for j in "${!pids[@]}"; do
  wait "${pids[$j]}"
  rc=$?
  [ $rc = 0 ] || smoke_ok=0
  [ $rc = 124 ] && hung=1
  tail -1 "$LOG/smoke$j.log"
done
if [ $smoke_ok = 0 ]; then
  status=1
  for j in "${!pids[@]}"; do tail -3 "$LOG/smoke$j.log"; done
  if [ $hung = 1 ]; then echo "--- a smoke call hung: no diagnostic"; wait $ptxas_pid; grep -E "registers|spill|C75" "$LOG/ptxas.txt"; finish; fi
  timeout $(cap 60) $PY ci/gpu/sm90_diag.py seesaw2 staggered_small 2>&1 | tee "$LOG/diag.log" | grep -E "^seesaw2|^staggered" | head -40
  timeout $(cap 60) $PY -m pytest -q -m gpu -k seesaw2 -x tests/ops/test_sm90.py -p no:cacheprovider > "$LOG/pytest_sm90.log" 2>&1
  grep -E "passed|failed|FAILED|Error|rel L2" "$LOG/pytest_sm90.log" | head -20
  wait $ptxas_pid
  grep -E "registers|spill|C75" "$LOG/ptxas.txt"
  finish
fi

step bench
timeout $(cap 60) $PY -m kdengine.bench.kernel measure --set seesaw2 --out "$OUT/verify_kernel_seesaw2.json" \
  --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench.log" | grep -E "ctx|ceiling" || status=1

step ncu  # one launch of the split kernel each (cold L2), reports kept in logs.tgz
for spec in $NCU; do
  [ $((DEADLINE - SECONDS)) -gt 60 ] || { echo "--- ncu $spec skipped (time)"; continue; }
  IFS=: read -r sched T <<< "$spec"
  rep="$LOG/ncu_${sched}_T$T"
  timeout $(cap 30) ncu --clock-control none -k regex:verify_sm90 --launch-count 1 --section SpeedOfLight \
    --section WarpStateStats --metrics "$NCU_METRICS" --export "$rep" --force-overwrite \
    $PY -m kdengine.bench.kernel once --path sm90_$sched --T $T --prefix $((65536 - T)) > "$rep.log" 2>&1 || true
  ncu --import "$rep.ncu-rep" --page raw > "$rep.raw.txt" 2>&1
  ncu --import "$rep.ncu-rep" > "$rep.txt" 2>&1
  rm -f "$rep.ncu-rep"
  echo "--- ncu sm90_$sched 65k T=$T"
  grep -E "(sm__pipe_tensor_op_hmma_cycles_active|smsp__issue_active|sm__warps_active)\.avg|gpu__time_duration.sum|smsp__inst_executed.sum|lts__t_bytes.sum|launch__registers|launch__block_size" \
    "$rep.raw.txt"
  grep -E "issue_stalled_[a-z_]+_per_issue_active.ratio" "$rep.raw.txt" | awk '$NF + 0 >= 0.05' | head -16
done

step checks  # correctness, all at once: the seesaw2 GPU tests, racecheck and memcheck of seesaw2
timeout $(cap 120) $PY -m pytest -q -m gpu -k seesaw2 tests/ops/test_sm90.py -p no:cacheprovider > "$LOG/pytest_sm90.log" 2>&1 &
t1=$!
san=()
i=0
specs=()
# 5 tiles in one split (both table slots, an odd last step), T=64 over 4 splits (a tail in the last tile),
# three sequences with T=17 and 16-token pages (several pages per tile)
for tool in racecheck memcheck; do
  for args in "--T 3 --H 2 --prefix 300 --nsplit 1" "--T 64 --prefix 700 --nsplit 4" "--B 3 --T 17 --prefix 130 --page-size 16"; do
    specs+=("$tool $args")
  done
done
# (second run) the barrier usage itself (synccheck), and racecheck's single hazards with the threads and blocks involved
specs+=("synccheck --T 64 --prefix 700 --nsplit 4")
specs+=("racecheck --racecheck-report hazard --print-limit 40 --T 3 --H 2 --prefix 300 --nsplit 1")
for spec in "${specs[@]}"; do
  read -r tool rest <<< "$spec"
  opts=""
  args=$rest
  if [[ $rest == --racecheck-report* ]]; then opts="--racecheck-report hazard --print-limit 40"; args=${rest#--racecheck-report hazard --print-limit 40 }; fi
  timeout $(cap 110) compute-sanitizer --tool $tool $opts --error-exitcode 9 $PY -m kdengine.bench.kernel once --path sm90_seesaw2 $args \
    > "$LOG/san$i.log" 2>&1 &
  san[$i]=$!
  echo "$spec" > "$LOG/san$i.spec"
  i=$((i + 1))
done
checks_ok=1
wait $t1 || checks_ok=0
echo "--- pytest_sm90 -k seesaw2"; grep -E "passed|failed|FAILED|Error" "$LOG/pytest_sm90.log" | head -20
for j in "${!san[@]}"; do
  wait "${san[$j]}"
  rc=$?
  [ $rc = 0 ] || status=1
  echo "--- $(cat "$LOG/san$j.spec") rc=$rc"
  grep -E "Race reported|and (Read|Write) access|RACECHECK SUMMARY|ERROR SUMMARY|rel L2|Invalid|out of bounds|Barrier|barrier" "$LOG/san$j.log" | head -8
  grep -E "(Read|Write) Thread|Thread \(|in block" "$LOG/san$j.log" | head -12
done
wait $ptxas_pid
grep -E "registers|spill|C75" "$LOG/ptxas.txt"
grep -E "instructions \(|HGMMA" "$LOG/sass_loops.txt" | head -24
if [ $checks_ok = 0 ]; then status=1; fi

finish
