#!/usr/bin/env bash
# One device run for the sm90 kernel's pair schedule (issue 12 item 1): build for the local arch (ptxas
# report and SASS counts alongside), smoke calls of pair (a wrong or hanging kernel gets the localising
# diagnostic and the run ends there), then alone on the GPU the timing set `pair` (staggered, pair,
# FlashMLA at the six sizes) and ncu of staggered and pair at 65k T=64, then at once the GPU tests of both
# cuda paths and compute-sanitizer memcheck + racecheck of pair on three small shapes. Every step is cut by
# `timeout`, capped so that the run ends by $DEADLINE seconds (the log tarball is written in any case);
# everything lands in $OUT (the JSON and one log tarball).
#   usage: KDENGINE_COMMIT=<sha> SM90_WHL=<sgl_flash_mla wheel> DEADLINE=280 bash ci/gpu/sm90_pair.sh
set -o pipefail
OUT=${OUT:-/tmp/kdengine-pair-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
status=0
DEADLINE=${DEADLINE:-280}
cap() { local left=$((DEADLINE - SECONDS)); echo $(( left < $1 ? (left > 5 ? left : 5) : $1 )); }  # step limit
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)"; }
finish() {
  tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
  step "done status=$status"
  exit $status
}
once() { $PY -m kdengine.bench.kernel once "$@"; }

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
timeout $(cap 240) $PY -m kdengine.ops.build --arch native 2>&1 | tail -5 | tee "$LOG/build.log" || { status=1; finish; }

step smoke
i=0
for args in "--T 1 --H 1 --prefix 63" "--T 64 --prefix 700 --B 2" "--T 16 --prefix 4000" "--T 33 --H 2 --prefix 900 --nsplit 1"; do
  timeout $(cap 40) $PY -m kdengine.bench.kernel once --path sm90_pair $args > "$LOG/smoke$i.log" 2>&1 &
  pids[$i]=$!
  i=$((i + 1))
done
smoke_ok=1
for j in "${!pids[@]}"; do
  wait "${pids[$j]}" || smoke_ok=0
  tail -1 "$LOG/smoke$j.log"
done
if [ $smoke_ok = 0 ]; then
  status=1
  timeout $(cap 90) $PY ci/gpu/sm90_diag.py 2>&1 | tee "$LOG/diag.log" | grep -E "^pair|^staggered" | head -60
  finish
fi

step bench
timeout $(cap 100) $PY -m kdengine.bench.kernel measure --set pair --out "$OUT/verify_kernel_pair.json" \
  --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench.log" | grep -E "ctx|ceiling" || status=1

step ncu  # the report is kept (logs.tgz); details and the raw page (stall reasons) printed from it
for sched in staggered pair; do
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
  grep -E "issue_stalled_[a-z_]+_per_warp_active.pct " "$rep.raw.txt" | head -24
done
step checks  # correctness, all at once: tests of both paths, sanitizers of pair
timeout $(cap 170) $PY -m pytest -q -m gpu tests/ops/test_sm90.py -p no:cacheprovider > "$LOG/pytest_sm90.log" 2>&1 &
t1=$!
timeout $(cap 170) $PY -m pytest -q -m gpu tests/ops/test_cuda.py -k "matches_reference or graph or verify_attention" \
  -p no:cacheprovider > "$LOG/pytest_cuda.log" 2>&1 &
t2=$!
timeout $(cap 150) compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --path sm90_pair \
  --B 3 --T 17 --prefix 130 > "$LOG/memcheck.log" 2>&1 &
t3=$!
# racecheck of pair where its row tables' two slots are used once (3 tiles), reused (T=64, 4 splits) and
# with several sequences and a tail in either tile of a step; staggered beside it as the control
race=()
i=0
for args in "sm90_pair --T 3 --H 2 --prefix 140" "sm90_pair --T 64 --prefix 700 --nsplit 4" "sm90_pair --B 3 --T 17 --prefix 130" \
    "sm90_staggered --T 3 --H 2 --prefix 300 --nsplit 1"; do
  timeout $(cap 150) compute-sanitizer --tool racecheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --path $args \
    > "$LOG/racecheck$i.log" 2>&1 &
  race[$i]=$!
  echo "$args" > "$LOG/racecheck$i.args"
  i=$((i + 1))
done
checks_ok=1
for pid in $t1 $t2; do wait $pid || checks_ok=0; done
for f in pytest_sm90 pytest_cuda; do echo "--- $f"; grep -E "passed|failed|FAILED|Error" "$LOG/$f.log" | head -20; done
wait $t3 || status=1
echo "--- memcheck"; tail -4 "$LOG/memcheck.log"
for j in "${!race[@]}"; do
  wait "${race[$j]}" || status=1
  echo "--- racecheck $(cat "$LOG/racecheck$j.args")"
  grep -E "Race reported|and (Read|Write) access|RACECHECK SUMMARY" "$LOG/racecheck$j.log" | head -8
done
wait $ptxas_pid
grep -E "registers|spill|C75" "$LOG/ptxas.txt"
grep -oE "HGMMA[.A-Za-z0-9_]*|WARPGROUP[.A-Za-z0-9_]*|LDL|STL" "$LOG/verify_sm90.sass" | sort | uniq -c
if [ $checks_ok = 0 ]; then status=1; fi

finish
