#!/usr/bin/env bash
# One device run for staggered_small's tail mask from packed words (csrc/verify_sm90.cuh tail_bits: the <= 3
# mask words of each row loaded together under S instead of a rolled loop of a load per score), to decide
# cuda_backend.SMALL_MIN_TILES: build this commit and $BASE (the commit before, its own checkout and cache)
# for the local arch, the SASS loop counts of both (ci/gpu/sass_loops.py), smoke calls of staggered_small,
# then alone on the GPU the timing set `icache` (staggered, staggered_small, staggered_tail, staggered again as
# the A/A control, FlashMLA; six sizes) of $BASE and of this commit, the `merge` set (the dispatched schedule
# with and without the merge), then at once the staggered GPU tests of tests/ops/test_sm90.py (the new tail
# word cases included) and compute-sanitizer racecheck + memcheck of staggered_small on small shapes, ncu of
# staggered / staggered_small at 4k T=64 if time is left. Every step is cut by `timeout`, capped so that the
# run ends by $DEADLINE seconds (the log tarball is written in any case); everything lands in $OUT.
#   usage: KDENGINE_COMMIT=<sha> BASE=<sha> SM90_WHL=<sgl_flash_mla wheel> DEADLINE=160 bash ci/gpu/sm90_small4k.sh
set -o pipefail
OUT=${OUT:-/tmp/kdengine-small4k-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
status=0
DEADLINE=${DEADLINE:-160}
cap() { local left=$((DEADLINE - SECONDS)); echo $(( left < $1 ? (left > 5 ? left : 5) : $1 )); }  # step limit
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)"; }
finish() {
  tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
  step "done status=$status"
  exit $status
}
sass() {  # $1: checkout, $2: tag
  nvcc -std=c++17 -O3 -lineinfo -Xptxas -v -gencode=arch=compute_90a,code=sm_90a -c "$1/csrc/verify_sm90.cu" \
    -o "/tmp/verify_sm90_$2.o" > "$LOG/ptxas_$2.txt" 2>&1 && cuobjdump -sass "/tmp/verify_sm90_$2.o" > "/tmp/verify_sm90_$2.sass" 2>&1 \
    && $PY ci/gpu/sass_loops.py "/tmp/verify_sm90_$2.sass" 'kernelILi[256]E' > "$LOG/sass_loops_$2.txt" 2>&1
}

STALLS=$(for r in wait long_scoreboard barrier gmma no_instruction branch_resolving; do
          printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' $r; done)
NCU_METRICS="${STALLS}sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,smsp__inst_executed.sum"

step info
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOG/smi.txt"
if [ -n "${SM90_WHL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $SM90_WHL 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
fi
BASE_DIR=/tmp/kd_base
[ -n "${BASE:-}" ] && { rm -rf $BASE_DIR; git worktree add -q --detach $BASE_DIR "$BASE" || BASE=; }

step build
( sass . new; [ -n "${BASE:-}" ] && sass $BASE_DIR base ) &
sass_pid=$!
if [ -n "${BASE:-}" ]; then
  ( cd $BASE_DIR && KDENGINE_CACHE_DIR=/tmp/kdengine-cache-base PYTHONPATH=/tmp/site:$BASE_DIR \
      timeout $(cap 80) $PY -m kdengine.ops.build --arch native > "$LOG/build_base.log" 2>&1 ) &
  base_pid=$!
fi
timeout $(cap 80) $PY -m kdengine.ops.build --arch native 2>&1 | tail -5 | tee "$LOG/build.log" || { status=1; finish; }
base_ok=0
[ -n "${BASE:-}" ] && wait $base_pid && base_ok=1
tail -2 "$LOG/build_base.log" 2>/dev/null

step smoke
i=0
for args in "--T 1 --H 1 --prefix 63" "--T 64 --prefix 700 --B 2" "--T 17 --H 4 --prefix 150 --nsplit 1" \
            "--T 65 --H 2 --prefix 95 --nsplit 3" "--T 256 --H 1 --prefix 31 --nsplit 2"; do
  timeout $(cap 30) $PY -m kdengine.bench.kernel once --path sm90_staggered_small $args > "$LOG/smoke$i.log" 2>&1 &
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
  for j in "${!pids[@]}"; do tail -3 "$LOG/smoke$j.log"; done
  finish
fi

step bench  # the base commit's icache set first, then this commit's, then the merge set
if [ $base_ok = 1 ]; then
  ( cd $BASE_DIR && KDENGINE_CACHE_DIR=/tmp/kdengine-cache-base PYTHONPATH=/tmp/site:$BASE_DIR \
      timeout $(cap 40) $PY -m kdengine.bench.kernel measure --set icache --out "$OUT/verify_kernel_icache_base.json" \
      --commit "$BASE" ) 2>&1 | tee "$LOG/bench_base.log" | grep -E "ctx|ceiling"
fi
timeout $(cap 40) $PY -m kdengine.bench.kernel measure --set icache --out "$OUT/verify_kernel_icache.json" \
  --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench.log" | grep -E "ctx|ceiling" || status=1
timeout $(cap 30) $PY -m kdengine.bench.kernel measure --set merge --out "$OUT/verify_kernel_merge.json" \
  --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench_merge.log" | grep -E "ctx" || status=1

step checks  # correctness, all at once: the staggered GPU tests, racecheck and memcheck of staggered_small
timeout $(cap 70) $PY -m pytest -q -m gpu -k "staggered or nan_past or graphs" tests/ops/test_sm90.py -p no:cacheprovider \
  > "$LOG/pytest_sm90.log" 2>&1 &
t1=$!
san=()
i=0
for spec in "racecheck --T 64 --prefix 700 --nsplit 4" "memcheck --T 64 --prefix 700 --nsplit 4" \
            "racecheck --T 33 --H 2 --prefix 95 --nsplit 3" "memcheck --T 65 --H 2 --prefix 95 --nsplit 3"; do
  read -r tool args <<< "$spec"
  timeout $(cap 60) compute-sanitizer --tool $tool --error-exitcode 9 $PY -m kdengine.bench.kernel once \
    --path sm90_staggered_small $args > "$LOG/san$i.log" 2>&1 &
  san[$i]=$!
  echo "$spec" > "$LOG/san$i.spec"
  i=$((i + 1))
done
checks_ok=1
wait $t1 || checks_ok=0
echo "--- pytest_sm90 -k 'staggered or nan_past or graphs'"; grep -E "passed|failed|FAILED|Error" "$LOG/pytest_sm90.log" | head -20
for j in "${!san[@]}"; do
  wait "${san[$j]}"
  rc=$?
  [ $rc = 0 ] || status=1
  echo "--- staggered_small $(cat "$LOG/san$j.spec") rc=$rc"
  grep -E "Race reported|and (Read|Write) access|RACECHECK SUMMARY|ERROR SUMMARY|rel L2|Invalid|out of bounds" "$LOG/san$j.log" | head -8
done
wait $sass_pid
for tag in base new; do
  echo "--- $tag"; grep -E "registers|spill|C75" "$LOG/ptxas_$tag.txt" 2>/dev/null | sort | uniq -c
  grep -E "instructions \(|HGMMA 40" "$LOG/sass_loops_$tag.txt" 2>/dev/null | head -12
done
if [ $checks_ok = 0 ]; then status=1; fi

step ncu  # optional: one launch each at 4k T=64 (cold L2), if time is left
for sched in staggered staggered_small; do
  [ $((DEADLINE - SECONDS)) -gt 30 ] || { echo "--- ncu $sched skipped (time)"; continue; }
  rep="$LOG/ncu_${sched}_4k_T64"
  timeout $(cap 25) ncu --clock-control none -k regex:verify_sm90 --launch-count 1 \
    --section SpeedOfLight --section WarpStateStats --metrics "$NCU_METRICS" --export "$rep" --force-overwrite \
    $PY -m kdengine.bench.kernel once --path sm90_$sched --T 64 --prefix $((4096 - 64)) > "$rep.log" 2>&1 || true
  ncu --import "$rep.ncu-rep" --page raw > "$rep.raw.txt" 2>&1
  echo "--- ncu sm90_$sched 4k T=64"
  grep -E "(sm__pipe_tensor_op_hmma_cycles_active|smsp__issue_active)\.avg|gpu__time_duration.sum|smsp__inst_executed.sum" \
    "$rep.raw.txt"
  grep -E "issue_stalled_[a-z_]+_per_issue_active.ratio" "$rep.raw.txt" | awk '$NF + 0 >= 0.05' | head -8
done

finish
