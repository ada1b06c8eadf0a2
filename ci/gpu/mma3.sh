#!/usr/bin/env bash
# One short device run for the lean wide2pp2 variant (branch mma3; ci/gpu/mma2.sh cut to fit ~120 s): build for
# the local arch, smoke calls of the variant, the kernel sweep set `mma2` (default, the default again as an A/A
# control, the default at fixed NSPLIT, MMA2_LAYOUTS (at a987463 the variant; since then the previous default),
# FlashMLA at the six sizes), ncu of wide2pp2 and its lean form at 65k T=16 only (WarpStateStats,
# SourceCounters), then at once the variant's GPU
# tests (-k 2lean), memcheck + racecheck of the variant on one small shape each, and the rest of the mma GPU
# tests while time remains. Every step is cut by `timeout`, capped so the run ends by $DEADLINE seconds; logs
# travel as one tarball ($OUT/logs.tgz, packed on exit), the sweep JSON beside it.
#   here:   mkdir -p /work/main/out/mma3 && git bundle create /work/main/out/mma3/kd.bundle HEAD
#           && cp /work/main/.whl/sgl_flash_mla-*.whl /work/main/out/mma3/
#   device: FLASHMLA_WHL=... bash ci/gpu/mma3.sh
set -o pipefail
OUT=${OUT:-/tmp/kdengine-mma3-out}; LOGS=/tmp/mma3-logs; rm -rf "$LOGS"; mkdir -p "$OUT" "$LOGS"
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdcache}
PY=${PYTHON:-python3}
DEADLINE=${DEADLINE:-120}
STEPS=${STEPS:-"build smoke bench ncu checks"}
NCU=${NCU:-"16:2 16:3"}   # col_warps:pingpong profiled: wide2pp2, its lean form (the default since a987463)
VARIANT=${VARIANT:-"16:3"}
status=0
want() { [[ " $STEPS " == *" $1 "* ]]; }
cap() { local left=$((DEADLINE - SECONDS)); echo $(( left < $1 ? (left > 3 ? left : 3) : $1 )); }
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)"; }
sha=$(git rev-parse --short HEAD 2>/dev/null); echo "commit $sha"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOGS/smi.txt"
if [ -n "${FLASHMLA_WHL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $FLASHMLA_WHL 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
IFS=: read -r vcw vpp <<< "$VARIANT"

step build
timeout $(cap 70) $PY -m kdengine.ops.build --arch native > "$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; exit 1; }
tail -1 "$LOGS/build.log"

if want smoke; then
  step smoke
  i=0; pids=()
  for args in "--T 1 --H 1 --prefix 63" "--T 64 --prefix 700 --B 2" "--T 33 --H 2 --prefix 900 --nsplit 1"; do
    ( timeout $(cap 25) $PY -m kdengine.bench.kernel once --col-warps $vcw --pingpong $vpp $args > "$LOGS/smoke_$i.log" 2>&1
      echo "cw$vcw pp$vpp $args rc=$? $(tail -1 "$LOGS/smoke_$i.log")" > "$LOGS/smoke_$i.res" ) &
    pids+=($!); i=$((i + 1))
  done
  for pid in "${pids[@]}"; do wait $pid; done
  cat "$LOGS"/smoke_*.res | tee "$LOGS/smoke.log"
  if grep -qv "rc=0" "$LOGS/smoke.log"; then  # wrong or hanging: no timing, no ncu; the checks still run
    status=1; STEPS=${STEPS/bench/}; NCU=""
    grep -h -B2 -A30 -E "Error|error" "$LOGS"/smoke_*.log | head -40
  fi
fi

if want bench; then
  step bench
  timeout $(cap 30) $PY -m kdengine.bench.kernel measure --set mma2 --out "$OUT/verify_kernel_mma3_$sha.json" \
    --commit "${KDENGINE_COMMIT:-$sha}" 2>&1 | tee "$LOGS/bench.log" | grep -E "ctx|ceiling" || status=1
fi

if want ncu; then
  step ncu
  for spec in $NCU; do
    IFS=: read -r cw pp <<< "$spec"
    T=16; rep="$LOGS/ncu_cw${cw}_pp${pp}_T$T"
    timeout $(cap 20) ncu --clock-control none -k regex:verify_split --launch-count 1 --import-source yes \
      --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section SourceCounters \
      --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__inst_executed_pipe_tensor_op_hmma.sum \
      --export "$rep" --force-overwrite \
      $PY -m kdengine.bench.kernel once --T $T --prefix $((65536 - T)) --col-warps $cw --pingpong $pp > "$rep.log" 2>&1 || true
    ncu --import "$rep.ncu-rep" > "$rep.txt" 2>&1
    ncu --import "$rep.ncu-rep" --page raw > "$rep.raw.txt" 2>&1
    ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
    echo "--- ncu cw$cw pp$pp 65k T=$T"
    grep -E "Duration|Issue Slots Busy|Eligible Warps|Warp Cycles Per Issued|Registers Per" "$rep.txt" | head -8
    grep -E "smsp__inst_executed.sum |smsp__inst_executed_pipe_tensor_op_hmma.sum |sm__pipe_tensor_op_hmma_cycles_active" "$rep.raw.txt" | head -3
    grep -E "smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio " "$rep.raw.txt" \
      | awk '$NF+0 > 0.05' | sort -k3 -g -r | head -10 | tee "$rep.raw_stalls.txt"
    $PY ci/gpu/ncu_source_top.py "$rep.sass.csv" 30 > "$rep.sass.top.txt" 2>&1; head -12 "$rep.sass.top.txt"
    rm -f "$rep.ncu-rep"; gzip -f "$rep.raw.txt" "$rep.sass.csv"
  done
fi

if want checks; then
  step checks  # the variant's GPU tests and its sanitizers at once, then the other mma GPU tests
  timeout $(cap 60) $PY -m pytest -q -m gpu tests/ops/test_cuda.py -k 2lean -p no:cacheprovider > "$LOGS/pytest_lean.log" 2>&1 &
  t1=$!
  pids=(); i=0
  for args in "memcheck --B 3 --T 17 --prefix 130 --nsplit 4" "racecheck --B 2 --T 17 --H 2 --prefix 130 --nsplit 3"; do
    set -- $args; tool=$1; shift
    ( timeout $(cap 60) compute-sanitizer --tool $tool --print-limit 4 --error-exitcode 9 \
        $PY -m kdengine.bench.kernel once --col-warps $vcw --pingpong $vpp "$@" > "$LOGS/san$i.log" 2>&1
      echo "$tool cw$vcw pp$vpp $* rc=$?" >> "$LOGS/san$i.log" ) &
    pids+=($!); i=$((i + 1))
  done
  wait $t1 || status=1
  echo "--- pytest (variant)"; grep -E "passed|failed|FAILED|Error" "$LOGS/pytest_lean.log" | head -20
  for pid in "${pids[@]}"; do wait $pid; done
  for f in "$LOGS"/san*.log; do
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Race reported|Invalid" "$f" | head -4; tail -1 "$f"
    grep -q "rc=0" "$f" || status=1
  done
  if [ $((DEADLINE - SECONDS)) -gt 10 ]; then
    timeout $(cap 100) $PY -m pytest -q -m gpu tests/ops/test_cuda.py -k "not 2lean" -p no:cacheprovider \
      > "$LOGS/pytest_rest.log" 2>&1
    echo "--- pytest (the other mma GPU tests, rc=$?: 124 = cut at the deadline)"
    grep -E "passed|failed|FAILED|Error" "$LOGS/pytest_rest.log" | head -10
  fi
fi
step "done status=$status"
exit $status
