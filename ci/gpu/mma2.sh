#!/usr/bin/env bash
# One device run for the mma.sync path rework (branch mma2): build for the local arch (ptxas report and
# SASS of the mma kernels alongside), smoke calls of every layout in LAYOUTS, then alone on the GPU the
# kernel sweep set `mma2` (old default, the old default again as an A/A control, the new layout(s),
# FlashMLA at the six sizes), ncu of each layout in NCU at 65k T=16 / T=64 (SpeedOfLight, WarpStateStats,
# SourceCounters with the source imported: the per-instruction stall samples, top lines printed), then at
# once the GPU tests of the mma path and compute-sanitizer memcheck + racecheck of each layout in SAN.
# Every step is cut by `timeout`, capped so that the run ends by $DEADLINE seconds; the logs travel as one
# tarball ($OUT/logs.tgz, packed on exit), the sweep JSON beside it.
#   here:   mkdir -p /work/main/out/mma2 && git bundle create /work/main/out/mma2/kd.bundle HEAD
#           && cp /work/main/.whl/sgl_flash_mla-*.whl /work/main/out/mma2/
#   device: STEPS="build ncu" bash ci/gpu/mma2.sh      (the profiling call)
#           bash ci/gpu/mma2.sh                        (all: build smoke bench ncu checks)
#           NCU=16:2 SAN=16:2 SMOKE=16:2 bash ci/gpu/mma2.sh   (the third run: wide2pp2)
#   layouts are --col-warps values of `kdengine.bench.kernel once` (cuda_backend.COL_WARPS).
set -o pipefail
OUT=${OUT:-/tmp/kdengine-mma2-out}; LOGS=/tmp/mma2-logs; rm -rf "$LOGS"; mkdir -p "$OUT" "$LOGS"
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdcache}
PY=${PYTHON:-python3}
DEADLINE=${DEADLINE:-400}
STEPS=${STEPS:-"build smoke bench ncu checks"}
NCU=${NCU:-"16:1 32:1"}     # col_warps:pingpong of each layout profiled (the old default, then the new layout)
SAN=${SAN:-"32:1 32:0"}     # col_warps:pingpong of each layout sanitized
SMOKE=${SMOKE:-"32:1 32:0 16:1"}  # col_warps:pingpong of each layout smoke-called
status=0
want() { [[ " $STEPS " == *" $1 "* ]]; }
cap() { local left=$((DEADLINE - SECONDS)); echo $(( left < $1 ? (left > 5 ? left : 5) : $1 )); }
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)"; }
sha=$(git rev-parse --short HEAD 2>/dev/null); echo "commit $sha"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOGS/smi.txt"
if [ -n "${FLASHMLA_WHL:-}" ]; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site $FLASHMLA_WHL 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi

step build
( nvcc -std=c++17 -O3 -lineinfo -Xptxas -v --expt-relaxed-constexpr -gencode=arch=compute_90a,code=sm_90a \
    -c csrc/verify_kernel.cu -o /tmp/verify_kernel.o > "$LOGS/ptxas.txt" 2>&1 \
  && cuobjdump -sass /tmp/verify_kernel.o > "$LOGS/verify_kernel.sass" 2>&1 ) &
ptxas_pid=$!
timeout $(cap 200) $PY -m kdengine.ops.build --arch native > "$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; exit 1; }
tail -1 "$LOGS/build.log"

if want smoke; then
  step smoke
  i=0
  smoke_pids=()
  for spec in $SMOKE; do  # all calls at once, each with its own log
    IFS=: read -r cw pp <<< "$spec"
    for args in "--T 1 --H 1 --prefix 63" "--T 64 --prefix 700 --B 2" "--T 16 --prefix 4000" "--T 33 --H 2 --prefix 900 --nsplit 1"; do
      ( timeout $(cap 40) $PY -m kdengine.bench.kernel once --col-warps $cw --pingpong $pp $args > "$LOGS/smoke_$i.log" 2>&1
        echo "cw$cw pp$pp $args rc=$? $(tail -1 "$LOGS/smoke_$i.log")" > "$LOGS/smoke_$i.res" ) &
      smoke_pids+=($!)
      i=$((i + 1))
    done
  done
  for pid in "${smoke_pids[@]}"; do wait $pid; done
  cat "$LOGS"/smoke_*.res | tee "$LOGS/smoke.log"
  if grep -qv "rc=0" "$LOGS/smoke.log"; then  # a wrong or hanging layout: no timing and no ncu, the checks still run
    status=1
    STEPS=${STEPS/bench/}
    NCU=""
    grep -h -B2 -A30 -E "Error|error" "$LOGS"/smoke_*.log | head -40
  fi
fi

if want bench; then
  step bench
  timeout $(cap 200) $PY -m kdengine.bench.kernel measure --set mma2 --out "$OUT/verify_kernel_mma2_$sha.json" \
    --commit "${KDENGINE_COMMIT:-$sha}" 2>&1 | tee "$LOGS/bench.log" | grep -E "ctx|ceiling" || status=1
fi

if want ncu; then
  step ncu  # per layout and T: the report, its details page and the per-SASS-line source counters (CSV)
  for spec in $NCU; do
    IFS=: read -r cw pp <<< "$spec"
    for T in 16 64; do
      rep="$LOGS/ncu_cw${cw}_pp${pp}_T$T"
      timeout $(cap 70) ncu --clock-control none -k regex:verify_split --launch-count 1 --import-source yes \
        --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
        --section SourceCounters --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum \
        --export "$rep" --force-overwrite \
        $PY -m kdengine.bench.kernel once --T $T --prefix $((65536 - T)) --col-warps $cw --pingpong $pp > "$rep.log" 2>&1 || true
      ncu --import "$rep.ncu-rep" > "$rep.txt" 2>&1
      ncu --import "$rep.ncu-rep" --page raw > "$rep.raw.txt" 2>&1
      ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "$rep.sass.csv" 2>&1
      ncu --import "$rep.ncu-rep" --page source --csv --print-source cuda > "$rep.cuda.csv" 2>&1
      echo "--- ncu cw$cw pp$pp 65k T=$T"
      grep -E "Duration|Issue Slots Busy|Issued Warp|No Eligible|Active Warps Per|Eligible Warps|Warp Cycles Per Issued|hmma|issue_active|bank_conflicts|Registers Per|Achieved Occ" "$rep.txt" | head -16
      grep -E "smsp__average_warps_issue_stalled_[a-z_]+_per_issue_active.ratio " "$rep.raw.txt" \
        | awk '$NF+0 > 0.05' | sort -k3 -g -r | head -12
      $PY ci/gpu/ncu_source_top.py "$rep.cuda.csv" 25 2>&1 | tee "$rep.cuda.top.txt"
      $PY ci/gpu/ncu_source_top.py "$rep.sass.csv" 40 > "$rep.sass.top.txt" 2>&1
      rm -f "$rep.raw.txt.gz"; gzip -f "$rep.raw.txt" "$rep.sass.csv"
    done
  done
fi

if want checks; then
  step checks  # correctness, all at once: the mma path's GPU tests, the sanitizers of each layout in SAN
  timeout $(cap 170) $PY -m pytest -q -m gpu tests/ops/test_cuda.py -p no:cacheprovider > "$LOGS/pytest_cuda.log" 2>&1 &
  t1=$!
  pids=()
  i=0
  for spec in $SAN; do
    IFS=: read -r cw pp <<< "$spec"
    for args in "memcheck --B 3 --T 17 --prefix 130 --nsplit 4" "memcheck --T 3 --H 2 --prefix 2000 --nsplit 300" \
        "racecheck --T 5 --H 8 --prefix 40" "racecheck --B 2 --T 17 --H 2 --prefix 130 --nsplit 3"; do
      set -- $args
      tool=$1; shift
      ( timeout $(cap 150) compute-sanitizer --tool $tool --print-limit 4 --error-exitcode 9 \
          $PY -m kdengine.bench.kernel once --col-warps $cw --pingpong $pp "$@" > "$LOGS/san$i.log" 2>&1
        echo "$tool cw$cw pp$pp $* rc=$?" >> "$LOGS/san$i.log" ) &
      pids+=($!)
      i=$((i + 1))
    done
  done
  wait $t1 || status=1
  echo "--- pytest"; grep -E "passed|failed|FAILED|Error" "$LOGS/pytest_cuda.log" | head -20
  for pid in "${pids[@]}"; do wait $pid; done
  for f in "$LOGS"/san*.log; do
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|Race reported|Invalid" "$f" | head -4; tail -1 "$f"
    grep -q "rc=0" "$f" || status=1
  done
fi
wait $ptxas_pid
grep -E "verify_split_kernel_wide|registers|spill" "$LOGS/ptxas.txt" | grep -B1 -E "registers" | head -30
step "done status=$status"
exit $status
