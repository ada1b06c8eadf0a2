#!/usr/bin/env bash
# One device run for seesaw2 and a probe of it added as a schedule (PROBES: names after sm90_ in `kernel once
# --path`; first used for the probes of branch s2t64, since removed; last for seesaw2_soft, perf_history/kernel/
# s2soft_f222390): build for the local arch (ptxas report alongside), smoke calls of each on odd shapes (a hang ends the
# run there), then alone on the GPU the timing sets of SETS ("set:contexts[:trees]"; a set of kdengine.bench.kernel
# SETS, e.g. one with the probe beside seesaw2 and its A/A row), at once the seesaw2 GPU tests of
# tests/ops/test_sm90.py and compute-sanitizer (memcheck of every schedule in PROBES on three shapes, racecheck and
# synccheck of SAN on odd shapes), then ncu at 65k T=64 and T=16 of NCU (one process per size, one launch each, cold
# L2), last the per-SASS-line source counters of SOURCE at 65k T=64 if time is left (SOURCE="" skips it). Every step
# is cut by `timeout`, capped so that the run ends by $DEADLINE seconds (the log tarball is written in any case).
#   usage: KDENGINE_COMMIT=<sha> SM90_WHL=<sgl_flash_mla wheel> DEADLINE=200 PROBES="seesaw2 seesaw2_x" \
#          SETS="myset:all" bash ci/gpu/sm90_s2t64.sh
set -o pipefail
OUT=${OUT:-/tmp/kdengine-s2t64-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
status=0
DEADLINE=${DEADLINE:-200}
PROBES=${PROBES:-"seesaw2"}
SOURCE=${SOURCE-"seesaw2"}  # (set but empty: no source counters)
SAN=${SAN:-"seesaw2"}  # the probes sanitized on odd shapes (memcheck, synccheck, racecheck)
NCU=${NCU:-$PROBES}  # the schedules under ncu
SETS=${SETS:-"seesaw2:all nsplit:65536:16"}
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
nvcc --version | tail -2 | tee -a "$LOG/smi.txt"
if [ -n "${SM90_WHL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $SM90_WHL 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
fi

step build
( nvcc -std=c++17 -O3 -lineinfo -Xptxas -v -gencode=arch=compute_90a,code=sm_90a -c csrc/verify_sm90.cu \
    -o /tmp/verify_sm90.o > "$LOG/ptxas.txt" 2>&1 ) &
ptxas_pid=$!
timeout $(cap ${BUILD_CAP:-200}) $PY -m kdengine.ops.build --arch native 2>&1 | tail -5 | tee "$LOG/build.log" || { status=1; finish; }

step smoke
i=0
for sched in $PROBES; do
  for args in "--T 64 --prefix 700 --B 2" "--T 17 --H 4 --prefix 150 --nsplit 1" "--T 3 --H 2 --prefix 300 --nsplit 1"; do
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
  echo "$(cat "$LOG/smoke$j.spec"): rc=$rc $(tail -1 "$LOG/smoke$j.log")"
done
if [ $smoke_ok = 0 ]; then
  status=1
  [ $hung = 1 ] && { echo "--- a smoke call hung"; finish; }
fi

step bench
k=0
for spec in $SETS; do
  IFS=: read -r set ctx trees <<< "$spec"
  args=()
  [ "$ctx" != all ] && args+=(--contexts "$ctx")
  [ -n "$trees" ] && args+=(--trees "$trees")
  echo "--- set $set ${args[*]}"
  timeout $(cap 60) $PY -m kdengine.bench.kernel measure --set $set "${args[@]}" --out "$OUT/verify_kernel_${set}_$k.json" \
    --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench_${set}_$k.log" | grep -E "ctx" | sed 's/  */ /g' || status=1
  k=$((k + 1))
done

step checks  # correctness, all at once: the seesaw2 GPU tests (probes included), sanitizers of the probes
timeout $(cap 150) $PY -m pytest -q -m gpu -k seesaw2 tests/ops/test_sm90.py -p no:cacheprovider > "$LOG/pytest_sm90.log" 2>&1 &
t1=$!
san=()
i=0
specs=()
for sched in $PROBES; do specs+=("memcheck $sched --T 64 --prefix 700 --nsplit 4"); done
for sched in seesaw2 $SAN; do
  specs+=("memcheck $sched --T 3 --H 2 --prefix 300 --nsplit 1")
  specs+=("memcheck $sched --B 3 --T 17 --prefix 130 --page-size 16")
done
for sched in $SAN; do
  specs+=("synccheck $sched --T 17 --prefix 701 --nsplit 4")
  for args in "--T 3 --H 2 --prefix 300 --nsplit 1" "--T 64 --prefix 700 --nsplit 4" "--B 3 --T 17 --prefix 130 --page-size 16"; do
    specs+=("racecheck $sched $args")
  done
done
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
  [ $rc = 0 ] || status=1
  echo "--- $spec rc=$rc $(grep -hE "RACECHECK SUMMARY|ERROR SUMMARY" "$LOG/san$j.log" | head -1 | sed 's/=* *//') \
$(grep -hoE "rel L2 [0-9.e+-]+" "$LOG/san$j.log" | head -1)"
  grep -E "Invalid|out of bounds|Race reported" "$LOG/san$j.log" | sed 's/.*Race/Race/' | sort | uniq -c | head -4
done
wait $ptxas_pid
grep -E "registers|spill|C75" "$LOG/ptxas.txt" | sed 's/_ZN8kdengine4sm9018verify_sm90_kernel//' | head -40
if [ $checks_ok = 0 ]; then status=1; fi

step ncu  # one launch of each split kernel (cold L2: ncu flushes the caches before each), reports kept in logs.tgz
for T in 64 16; do
  [ $((DEADLINE - SECONDS)) -gt 20 ] || { echo "--- ncu T=$T skipped (time)"; continue; }
  rep="$LOG/ncu_T$T"
  timeout $(cap 60) ncu --clock-control none -k regex:verify_sm90_kernel --section SpeedOfLight \
    --section WarpStateStats --metrics "$NCU_METRICS" --export "$rep" --force-overwrite \
    $PY ci/gpu/sm90_once_many.py $T $((65536 - T)) $NCU > "$rep.log" 2>&1 || true
  ncu --import "$rep.ncu-rep" --page raw --csv > "$rep.raw.csv" 2>&1
  ncu --import "$rep.ncu-rep" > "$rep.txt" 2>&1
  rm -f "$rep.ncu-rep"
  grep "rel L2" "$rep.log"
  $PY - "$rep.raw.csv" $NCU <<'PYEOF'
import csv, sys
rows = [r for r in csv.DictReader(l for l in open(sys.argv[1]) if not l.startswith("=="))][1:]  # (units row)
keys = ["gpu__time_duration.sum", "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
        "smsp__issue_active.avg.pct_of_peak_sustained_active", "smsp__inst_executed.sum", "dram__bytes_read.sum"]
stalls = ["wait", "barrier", "long_scoreboard", "gmma", "no_instruction", "short_scoreboard", "mio_throttle",
          "dispatch_stall", "branch_resolving", "sleeping"]
print("kernel time_us tensor% issue% inst dram_rd " + " ".join(stalls))
for name, r in zip(sys.argv[2:], rows):
    vals = [r.get(k, "?") for k in keys]
    st = [r.get(f"smsp__average_warps_issue_stalled_{s}_per_issue_active.ratio", "?") for s in stalls]
    print(name, *vals, *st)
PYEOF
done

step source  # per-SASS-line stall samples of $SOURCE at 65k T=64 (ci/gpu/ncu_source_top.py)
for sched in $SOURCE; do
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
