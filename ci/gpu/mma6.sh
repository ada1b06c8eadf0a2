#!/usr/bin/env bash
# One device run for the probes of branch mma6 (ci/gpu/mma4.sh adapted, retired: ci/gpu/README.md): build for the local arch, smoke calls of the
# default (pingpong 8) and the probes (12, 13: Q staged through shared memory) with their rel L2, the kernel sweep set
# `mma6` at T = 16, 64 (the default, the default again as an A/A control, the probes), the GPU tests of the path
# (tests/ops/test_cuda.py: every layout incl. the probes) and tests/bench/test_kernel.py beside memcheck + racecheck of
# the default and each probe on two odd shapes (64-row blocks with rows past R, prefix not a multiple of the page), then
# ncu (tensor %, issue %, stall breakdown, SASS hot spots) at 65k of the default and the probes while time remains.
# Every step is cut by `timeout`, capped so the run ends by $DEADLINE seconds; logs travel as one tarball
# ($OUT/logs.tgz, packed on exit), the sweep JSON beside it.
#   here:   git bundle create /work/main/out/mma6/kd.bundle HEAD
#   device: DEADLINE=... bash ci/gpu/mma6.sh
set -o pipefail
OUT=${OUT:-/tmp/kdengine-mma6-out}; LOGS=/tmp/mma6-logs; rm -rf "$LOGS"; mkdir -p "$OUT" "$LOGS"
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdcache}
PY=${PYTHON:-python3}
DEADLINE=${DEADLINE:-180}
STEPS=${STEPS:-"build smoke bench checks ncu"}
SET=${SET:-mma6}   # the kernel sweep set of the bench step (mma7 at e1a18c1: the page-64 probe, since removed; mma8 at e949c85, removed)
PROBES=${PROBES:-"8 12 13 14 15"}   # the default and the probes (kdengine.ops.cuda_backend.PINGPONGS)
SAN2=${SAN2:-"8 12 13 15"}   # those sanitized on the second shape too
# pingpong:T profiled at 65k, in this order while time remains: the default, then the probes by their 65k median (bench;
# the fastest at T = 16, the fastest at T = 64, the second at each, ...)
NCU=${NCU:-"8:16 8:64"}
status=0
want() { [[ " $STEPS " == *" $1 "* ]]; }
cap() { local left=$((DEADLINE - SECONDS)); echo $(( left < $1 ? (left > 3 ? left : 3) : $1 )); }
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)"; }
sha=$(git rev-parse --short HEAD 2>/dev/null); echo "commit $sha"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOGS/smi.txt"
export PYTHONPATH=${PYTHONPATH:+$PYTHONPATH:}$PWD

step build
timeout $(cap ${BUILD_CAP:-200}) $PY -m kdengine.ops.build --arch native > "$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; exit 1; }
tail -1 "$LOGS/build.log"

if want smoke; then
  step smoke
  pids=()
  for pp in $PROBES; do
    ( timeout $(cap 40) $PY -m kdengine.bench.kernel once --col-warps 16 --pingpong $pp --T 64 --prefix 700 --B 2 \
        > "$LOGS/smoke_$pp.log" 2>&1
      echo "cw16 pp$pp rc=$? $(tail -1 "$LOGS/smoke_$pp.log")" > "$LOGS/smoke_$pp.res" ) &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait $pid; done
  cat "$LOGS"/smoke_*.res | tee "$LOGS/smoke.log"
  if grep -qv "rc=0" "$LOGS/smoke.log" || ! awk '/rel L2/ { if ($NF + 0 > 1e-2) bad = 1 } END { exit bad }' "$LOGS/smoke.log"; then
    status=1; grep -h -B2 -A30 -E "Error|error" "$LOGS"/smoke_*.log | head -40
  fi
fi

if want bench; then
  step bench
  timeout $(cap 60) $PY -m kdengine.bench.kernel measure --set $SET --trees 16,64 \
    --out "$OUT/verify_kernel_${SET}_$sha.json" --commit "${KDENGINE_COMMIT:-$sha}" 2>&1 | tee "$LOGS/bench.log" \
    | grep -E "ctx|ceiling" || status=1
fi

if want checks; then
  step checks  # the path's GPU tests (all layouts, the probes too) and the sanitizers at once
  timeout $(cap 75) $PY -m pytest -q -m gpu tests/ops/test_cuda.py -p no:cacheprovider > "$LOGS/pytest_cuda.log" 2>&1 &
  t1=$!
  timeout $(cap 75) $PY -m pytest -q tests/bench/test_kernel.py -p no:cacheprovider > "$LOGS/pytest_bench.log" 2>&1 &
  t2=$!
  pids=()
  for pp in $PROBES; do
    # 34 rows (64-row blocks, 30 rows past R), prefix 130; 48 rows (T = 3, H = 16), prefix 70 (the default and the
    # probes that stage Q)
    shapes=("--B 2 --T 17 --H 2 --prefix 130 --nsplit 3")
    [[ " $SAN2 " == *" $pp "* ]] && shapes+=("--B 1 --T 3 --H 16 --prefix 70 --nsplit 2")
    for shape in "${shapes[@]}"; do
      T=$(echo $shape | awk '{print $4}')
      for tool in memcheck racecheck; do
        ( timeout $(cap 80) compute-sanitizer --tool $tool --print-limit 4 --error-exitcode 9 \
            $PY -m kdengine.bench.kernel once --col-warps 16 --pingpong $pp $shape > "$LOGS/san_${tool}_pp${pp}_T$T.log" 2>&1
          echo "$tool cw16 pp$pp T$T rc=$?" >> "$LOGS/san_${tool}_pp${pp}_T$T.log" ) &
        pids+=($!)
      done
    done
  done
  wait $t1 || status=1
  echo "--- pytest tests/ops/test_cuda.py"; grep -E "passed|failed|FAILED|Error" "$LOGS/pytest_cuda.log" | head -20
  wait $t2 || status=1
  echo "--- pytest tests/bench/test_kernel.py"; grep -E "passed|failed|FAILED|Error" "$LOGS/pytest_bench.log" | head -10
  for pid in "${pids[@]}"; do wait $pid; done
  for f in "$LOGS"/san_*.log; do
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Race reported|Invalid" "$f" | head -3; tail -1 "$f"
    grep -q "rc=0" "$f" || status=1
  done
fi

if want ncu; then
  step ncu
  if [ -f "$LOGS/bench.log" ]; then  # the probes, fastest first at 65k (T = 16 then T = 64)
    ranked=$($PY - "$LOGS/bench.log" <<'PYEOF'
import re, sys
from kdengine.bench.kernel import PP_LABELS
label_pp = {f"pp{v}": k for k, v in PP_LABELS.items() if k >= 12}
rows = {}
for line in open(sys.argv[1]):
    m = re.match(r"ctx65536 T(\d+) cuda/\S*?/(pp\w+)/sauto\s.*?([\d.]+) us", line)
    if m and m.group(2) in label_pp:
        rows.setdefault(int(m.group(1)), []).append((float(m.group(3)), label_pp[m.group(2)]))
ranked = {T: [pp for _, pp in sorted(rows.get(T, []))] for T in (16, 64)}
print(" ".join(f"{pp}:{T}" for i in range(4) for T in (16, 64) if i < len(ranked[T]) for pp in [ranked[T][i]]))
PYEOF
)
    echo "probes at 65k, fastest first: $ranked"; NCU="$NCU $ranked"
  fi
  for spec in $NCU; do
    [ $((DEADLINE - SECONDS)) -gt 14 ] || { echo "ncu: out of time before pp:T $spec"; break; }
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
