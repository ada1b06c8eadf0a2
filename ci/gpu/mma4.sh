#!/usr/bin/env bash
# One device run for the lean probes of branch mma4 (ci/gpu/mma3.sh, retired at 069d638, adapted): build for the local arch, smoke calls
# of every probe, the kernel sweep set `mma4` at T = 1, 2, 4 (32-row blocks: the default, i.e. wide2pp2 there, the
# default again as an A/A control, the lean form) and T = 16, 64 (the default, A/A, the probes pingpong 5-8), then
# the GPU tests of every lean form (-k 2lean: the default and the probes) with memcheck + racecheck of every probe on
# one small shape each, all at once, then ncu (SpeedOfLight, WarpStateStats, SchedulerStats, SourceCounters) at 65k of
# the default and the probes while time remains. Every step is cut by `timeout`, capped so the run ends by $DEADLINE
# seconds; logs travel as one tarball ($OUT/logs.tgz, packed on exit), the sweep JSON beside it.
#   here:   mkdir -p /work/main/out/mma4 && git bundle create /work/main/out/mma4/kd.bundle HEAD
#   device: DEADLINE=... bash ci/gpu/mma4.sh
set -o pipefail
OUT=${OUT:-/tmp/kdengine-mma4-out}; LOGS=/tmp/mma4-logs; rm -rf "$LOGS"; mkdir -p "$OUT" "$LOGS"
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdcache}
PY=${PYTHON:-python3}
DEADLINE=${DEADLINE:-225}
STEPS=${STEPS:-"build smoke bench checks ncu"}
PROBES=${PROBES:-"4 5 6 7 8 9 10 11"}   # pingpong values of the probes (kdengine.ops.cuda_backend.PINGPONGS)
# pingpong:T profiled at 65k, in this order while time remains (3 = the default)
NCU=${NCU:-"3:16 3:64 8:16 8:64 10:16 10:64 9:16 11:16 5:16 6:16 7:16"}
status=0
want() { [[ " $STEPS " == *" $1 "* ]]; }
cap() { local left=$((DEADLINE - SECONDS)); echo $(( left < $1 ? (left > 3 ? left : 3) : $1 )); }
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)"; }
sha=$(git rev-parse --short HEAD 2>/dev/null); echo "commit $sha"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOGS/smi.txt"
export PYTHONPATH=$PWD

step build
timeout $(cap 90) $PY -m kdengine.ops.build --arch native > "$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; exit 1; }
tail -1 "$LOGS/build.log"

if want smoke; then
  step smoke
  pids=()
  for pp in $PROBES; do
    args="--T 64 --prefix 700 --B 2"; [ "$pp" = 4 ] && args="--T 4 --prefix 900 --B 2"
    ( timeout $(cap 40) $PY -m kdengine.bench.kernel once --col-warps 16 --pingpong $pp $args > "$LOGS/smoke_$pp.log" 2>&1
      echo "cw16 pp$pp $args rc=$? $(tail -1 "$LOGS/smoke_$pp.log")" > "$LOGS/smoke_$pp.res" ) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait $pid; done
  cat "$LOGS"/smoke_*.res | tee "$LOGS/smoke.log"
  if grep -qv "rc=0" "$LOGS/smoke.log"; then  # a wrong or hanging probe: its rows still time, the checks say which
    status=1; grep -h -B2 -A30 -E "Error|error" "$LOGS"/smoke_*.log | head -40
  fi
fi

if want bench; then
  step bench
  timeout $(cap 60) $PY -m kdengine.bench.kernel measure --set mma4 --trees 1,2,4,16,64 \
    --out "$OUT/verify_kernel_mma4_$sha.json" --commit "${KDENGINE_COMMIT:-$sha}" 2>&1 | tee "$LOGS/bench.log" \
    | grep -E "ctx|ceiling" || status=1
fi

if want checks; then
  step checks  # the lean GPU tests (default and probes) and the probes' sanitizers at once
  timeout $(cap 70) $PY -m pytest -q -m gpu tests/ops/test_cuda.py -k 2lean -p no:cacheprovider > "$LOGS/pytest_lean.log" 2>&1 &
  t1=$!
  pids=(); i=0
  for pp in $PROBES; do
    T=17; [ "$pp" = 4 ] && T=3
    for tool in memcheck racecheck; do
      ( timeout $(cap 80) compute-sanitizer --tool $tool --print-limit 4 --error-exitcode 9 \
          $PY -m kdengine.bench.kernel once --col-warps 16 --pingpong $pp --B 2 --T $T --H 2 --prefix 130 --nsplit 3 \
          > "$LOGS/san_${tool}_pp$pp.log" 2>&1
        echo "$tool cw16 pp$pp T$T rc=$?" >> "$LOGS/san_${tool}_pp$pp.log" ) &
      pids+=($!)
    done
  done
  wait $t1 || status=1
  echo "--- pytest (-k 2lean)"; grep -E "passed|failed|FAILED|Error" "$LOGS/pytest_lean.log" | head -20
  for pid in "${pids[@]}"; do wait $pid; done
  for f in "$LOGS"/san_*.log; do
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Race reported|Invalid" "$f" | head -3; tail -1 "$f"
    grep -q "rc=0" "$f" || status=1
  done
fi

if want ncu; then
  step ncu
  for spec in $NCU; do
    [ $((DEADLINE - SECONDS)) -gt 12 ] || { echo "ncu: out of time before pp:T $spec"; break; }
    IFS=: read -r pp T <<< "$spec"
    rep="$LOGS/ncu_cw16_pp${pp}_T$T"
    timeout $(cap 25) ncu --clock-control none -k regex:verify_split --launch-count 1 --import-source yes \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters \
      --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__inst_executed_pipe_tensor_op_hmma.sum \
      --export "$rep" --force-overwrite \
      $PY -m kdengine.bench.kernel once --T $T --prefix $((65536 - T)) --col-warps 16 --pingpong $pp > "$rep.log" 2>&1 || true
    [ -f "$rep.ncu-rep" ] || { echo "--- ncu pp$pp 65k T=$T: no report"; continue; }
    ncu --import "$rep.ncu-rep" > "$rep.txt" 2>&1
    ncu --import "$rep.ncu-rep" --page raw > "$rep.raw.txt" 2>&1
    ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
    echo "--- ncu cw16 pp$pp 65k T=$T"
    grep -E "Duration|Eligible Warps|Warp Cycles Per Issued|Registers Per" "$rep.txt" | head -6
    grep -E "smsp__inst_executed.sum |smsp__inst_executed_pipe_tensor_op_hmma.sum |sm__pipe_tensor_op_hmma_cycles_active.avg|smsp__issue_active.avg.pct" "$rep.raw.txt" | head -4
    grep -E "smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio " "$rep.raw.txt" \
      | awk '$NF+0 > 0.05' | sort -k3 -g -r | head -8 | tee "$rep.raw_stalls.txt"
    $PY ci/gpu/ncu_source_top.py "$rep.sass.csv" 30 > "$rep.sass.top.txt" 2>&1; head -6 "$rep.sass.top.txt"; tail -3 "$rep.sass.top.txt"
    rm -f "$rep.ncu-rep"; gzip -f "$rep.raw.txt" "$rep.sass.csv"
  done
fi
step "done status=$status"
exit $status
