#!/usr/bin/env bash
# One device run for seesaw2 and its probes (csrc/verify_sm90.cuh S2_PROBE_FLAGS; kdengine.ops.cuda_backend
# SEESAW2_PROBES; seesaw2_v0 = seesaw2 before this branch): build for the local arch (ptxas report alongside), smoke
# calls of each on two odd shapes (a hang ends the run there), then alone on the GPU the timing set `s2tune`
# (staggered_small, seesaw2, the probes, staggered_small again as the A/A control, FlashMLA at the six sizes), at
# once the seesaw2 GPU tests of tests/ops/test_sm90.py (the probes included) and compute-sanitizer (memcheck of
# every one; synccheck and racecheck of seesaw2 on three shapes, racecheck of seesaw2_v0), the set again at 65k
# (the second record: 65k T=64 spreads 4-6% within a run), ncu at 65k T=64 and T=16 of each (one process per size,
# one launch each, cold L2), last the per-SASS-line source counters of seesaw2 and $SOURCE at 65k T=64 if time is
# left. Every step is cut by `timeout`, capped so that the run ends by $DEADLINE seconds (the log tarball is
# written in any case).
#   usage: KDENGINE_COMMIT=<sha> SM90_WHL=<sgl_flash_mla wheel> DEADLINE=135 bash ci/gpu/sm90_s2tune.sh
set -o pipefail
OUT=${OUT:-/tmp/kdengine-s2tune-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
status=0
DEADLINE=${DEADLINE:-300}
PROBES="seesaw2 seesaw2_v0 seesaw2_ahead seesaw2_alate seesaw2_apro seesaw2_aolp"
SOURCE=${SOURCE:-seesaw2_v0}
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
dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,lts__t_bytes.sum,gpu__time_duration.sum,\
smsp__inst_executed.sum"

step info
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOG/smi.txt"
if [ -n "${SM90_WHL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $SM90_WHL 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
fi

step build
( nvcc -std=c++17 -O3 -lineinfo -Xptxas -v -gencode=arch=compute_90a,code=sm_90a -c csrc/verify_sm90.cu \
    -o /tmp/verify_sm90.o > "$LOG/ptxas.txt" 2>&1 ) &
ptxas_pid=$!
timeout $(cap 120) $PY -m kdengine.ops.build --arch native 2>&1 | tail -5 | tee "$LOG/build.log" || { status=1; finish; }

step smoke
i=0
for sched in $PROBES; do
  for args in "--T 64 --prefix 700 --B 2" "--T 17 --H 4 --prefix 150 --nsplit 1"; do
    timeout $(cap 40) $PY -m kdengine.bench.kernel once --path sm90_$sched $args > "$LOG/smoke$i.log" 2>&1 &
    pids[$i]=$!
    echo "$sched $args" > "$LOG/smoke$i.spec"
    i=$((i + 1))
  done
done
smoke_ok=1
hung=0
for j in "${!pids[@]}"; do
  wait "${pids[$j]}"
  rc=$?
  [ $rc = 0 ] || smoke_ok=0
  [ $rc = 124 ] && hung=1
  echo "$(cat "$LOG/smoke$j.spec"): $(tail -1 "$LOG/smoke$j.log")"
done
if [ $smoke_ok = 0 ]; then
  status=1
  [ $hung = 1 ] && { echo "--- a smoke call hung"; finish; }
fi

step bench
timeout $(cap 90) $PY -m kdengine.bench.kernel measure --set s2tune --out "$OUT/verify_kernel_s2tune.json" \
  --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench.log" | grep -E "ctx|ceiling" || status=1
step checks  # correctness, all at once: the seesaw2 GPU tests (probes included), sanitizers of the probes
timeout $(cap 150) $PY -m pytest -q -m gpu -k seesaw2 tests/ops/test_sm90.py -p no:cacheprovider > "$LOG/pytest_sm90.log" 2>&1 &
t1=$!
san=()
i=0
specs=()
for sched in $PROBES; do specs+=("memcheck $sched --T 64 --prefix 700 --nsplit 4"); done
specs+=("memcheck seesaw2 --T 3 --H 2 --prefix 300 --nsplit 1")
specs+=("memcheck seesaw2 --B 3 --T 17 --prefix 130 --page-size 16")
specs+=("synccheck seesaw2 --T 64 --prefix 700 --nsplit 4")
for args in "--T 3 --H 2 --prefix 300 --nsplit 1" "--T 64 --prefix 700 --nsplit 4" "--B 3 --T 17 --prefix 130 --page-size 16"; do
  specs+=("racecheck seesaw2 $args")
done
specs+=("racecheck seesaw2_v0 --T 3 --H 2 --prefix 300 --nsplit 1")
for spec in "${specs[@]}"; do
  read -r tool sched args <<< "$spec"
  timeout $(cap 120) compute-sanitizer --tool $tool --error-exitcode 9 $PY -m kdengine.bench.kernel once \
    --path sm90_$sched $args > "$LOG/san$i.log" 2>&1 &
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
  spec=$(cat "$LOG/san$j.spec")
  [[ $rc = 0 || $spec == racecheck* ]] || status=1
  echo "--- $spec rc=$rc"
  grep -E "RACECHECK SUMMARY|ERROR SUMMARY|rel L2|Invalid|out of bounds" "$LOG/san$j.log" | head -4
  grep -E "Race reported" "$LOG/san$j.log" | sed 's/.*Race/Race/' | sort | uniq -c | head -6
done
wait $ptxas_pid
grep -E "registers|spill|C75" "$LOG/ptxas.txt"
if [ $checks_ok = 0 ]; then status=1; fi

step bench65k  # the set again at 65k: a second record of the sizes with the largest spread
timeout $(cap 45) $PY -m kdengine.bench.kernel measure --set s2tune --contexts 65536 \
  --out "$OUT/verify_kernel_s2tune_65k.json" --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench65k.log" \
  | grep -E "ctx" || status=1

step ncu  # one launch of each split kernel (cold L2: ncu flushes the caches before each), reports kept in logs.tgz
for T in 64 16; do
  [ $((DEADLINE - SECONDS)) -gt 20 ] || { echo "--- ncu T=$T skipped (time)"; continue; }
  rep="$LOG/ncu_T$T"
  timeout $(cap 60) ncu --clock-control none -k regex:verify_sm90_kernel --section SpeedOfLight \
    --section WarpStateStats --metrics "$NCU_METRICS" --export "$rep" --force-overwrite \
    $PY ci/gpu/sm90_once_many.py $T $((65536 - T)) $PROBES > "$rep.log" 2>&1 || true
  ncu --import "$rep.ncu-rep" --page raw --csv > "$rep.raw.csv" 2>&1
  ncu --import "$rep.ncu-rep" > "$rep.txt" 2>&1
  rm -f "$rep.ncu-rep"
  grep "rel L2" "$rep.log"
  $PY - "$rep.raw.csv" $PROBES <<'PYEOF'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("=="))][1:]  # (units row)
keys = ["gpu__time_duration.sum", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum", "dram__bytes_read.sum"]
stalls = ["wait", "barrier", "long_scoreboard", "gmma", "no_instruction", "short_scoreboard", "mio_throttle",
          "dispatch_stall", "branch_resolving"]
print("kernel time_us tensor% issue% inst dram_rd " + " ".join(stalls))
for name, r in zip(sys.argv[2:], rows):
    vals = [r.get(k, "?") for k in keys]
    st = [r.get(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio", "?") for s in stalls]
    print(name, *vals, *st)
PYEOF
done

step source  # per-SASS-line stall samples of seesaw2 and $SOURCE at 65k T=64 (ci/gpu/ncu_source_top.py)
for sched in seesaw2 $SOURCE; do
  [ $((DEADLINE - SECONDS)) -gt 35 ] || { echo "--- source $sched skipped (time)"; continue; }
  rep="$LOG/src_${sched}_T64"
  timeout $(cap 40) ncu --clock-control none -k regex:verify_sm90_kernel --launch-count 1 --import-source yes \
    --section SourceCounters --section WarpStateStats --export "$rep" --force-overwrite \
    $PY ci/gpu/sm90_once_many.py 64 $((65536 - 64)) $sched > "$rep.log" 2>&1 || true
  ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
  rm -f "$rep.ncu-rep"
  $PY ci/gpu/ncu_source_top.py "$rep.sass.csv" 40 > "$rep.sass.top.txt" 2>&1
  head -16 "$rep.sass.top.txt"
  gzip -f "$rep.sass.csv"
done

finish
