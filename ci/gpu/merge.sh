#!/usr/bin/env bash
# One device run for the verify merge (issue 12) on one H200: this branch and a baseline revision of
# the same bundle (BASE_REV) built side by side; the GPU tests of both cuda paths with compute-sanitizer
# memcheck + racecheck of both paths beside them; the timing set `paths` (both paths' defaults and
# FlashMLA) at the six sizes; ncu of the merge: kernel durations of split + merge at 65k T=16 / T=64
# with the caches as the split kernel left them (one pass), then the analysis sections, for this branch
# and the baseline; the baseline's end-to-end times last, while the budget lasts.
#   here:   mkdir -p out/merge && git bundle create out/merge/kd.bundle HEAD && cp .whl/sgl_flash_mla-*.whl out/merge/
#   device: S=$PWD; git clone -q out/merge/kd.bundle /tmp/kd && cd /tmp/kd && SRC=$S bash ci/gpu/merge.sh [steps]
#   steps: all (default) or any of base tests sanitize bench ncu; TESTS_K narrows the GPU tests (pytest -k).
set -o pipefail
STEPS=${*:-all}
want() { [[ " $STEPS " == *" all "* || " $STEPS " == *" $1 "* ]]; }
OUT=${OUT:-/tmp/kdengine-merge-out}
LOG=$OUT/logs
mkdir -p "$LOG"
SRC=${SRC:-$PWD}
KD=$PWD
BASE=/tmp/kd-base
BASE_REV=${BASE_REV:-efd9fa7}
END=$((SECONDS + ${BUDGET_S:-190}))
export PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
PY=python3
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)"; }
left() { echo $((END - SECONDS)); }
mine() { PYTHONPATH=/tmp/site:$KD KDENGINE_CACHE_DIR=/tmp/kdcache-merge "$@"; }
base() { PYTHONPATH=/tmp/site:$BASE KDENGINE_CACHE_DIR=/tmp/kdcache-base "$@"; }
sha=$(git rev-parse --short HEAD)

step info
echo "commit $sha, baseline $BASE_REV"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOG/smi.txt"
$PY -m pip install -q --no-index --no-deps --no-compile --target /tmp/site "$SRC"/out/merge/*.whl > "$LOG/pip.log" 2>&1 \
  || echo "FlashMLA wheel not installed"
if want base; then
  rm -rf "$BASE" && git clone -q "$SRC/out/merge/kd.bundle" "$BASE" 2>/dev/null && git -C "$BASE" checkout -q "$BASE_REV" || exit 1
fi

step build
if want base; then
  ( cd /tmp && base timeout 170 $PY -m kdengine.ops.build --arch native > "$LOG/build_base.log" 2>&1 ) &
  base_build=$!
fi
mine timeout 170 $PY -m kdengine.ops.build --arch native > "$LOG/build.log" 2>&1 || { tail -30 "$LOG/build.log"; exit 1; }
tail -1 "$LOG/build.log"

step "tests + sanitizers"
if want sanitize; then
  (
    # memcheck: the first errors of each run (kernel, access, address) and the summary; racecheck: the summary
    san() {
      local tool=$1 out=$LOG/san_$2.txt; shift 2
      mine timeout ${SAN_TIMEOUT:-40} compute-sanitizer --tool $tool --print-limit 2 --show-backtrace no --error-exitcode 9 \
        $PY -m kdengine.bench.kernel once "$@" > "$out" 2>&1
      echo "$tool $* rc=$?" >> "$out"
    }
    san memcheck 1 --path mma --B 3 --T 17 --prefix 130 &
    san memcheck 2 --path sm90_staggered --B 3 --T 17 --prefix 130 &
    san memcheck 3 --col-warps 16 --pingpong 1 --combine 2 --B 3 --T 17 --prefix 130 &
    san memcheck 4 --path mma --T 17 --prefix 130 &
    san memcheck 5 --path mma --T 3 --H 2 --prefix 2000 --nsplit 300 &  # the grouped merge past one batch
    san racecheck 6 --path mma --T 3 --H 2 --prefix 140 &
    san racecheck 7 --path sm90_staggered --T 3 --H 2 --prefix 140 &
    wait
    for f in "$LOG"/san_?.txt; do grep -vE "^=========\s*$" "$f" | head -14; tail -1 "$f"; done
  ) > "$LOG/sanitize.log" 2>&1 &
  sanitize=$!
fi
if want tests; then
  mine timeout ${TESTS_TIMEOUT:-90} $PY -m pytest -q -m gpu tests/ops/test_cuda.py tests/ops/test_sm90.py -p no:cacheprovider \
    --maxfail=20 ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$LOG/pytest_gpu.log" | grep -E "passed|failed|FAILED|Error" | head -30
fi
if want sanitize; then
  wait $sanitize
  cat "$LOG/sanitize.log" | cut -c1-220 | head -80
fi
if want base; then
  wait $base_build
  tail -1 "$LOG/build_base.log"
fi

want bench && step "bench paths ($(left) s left)" && \
mine timeout 70 $PY -m kdengine.bench.kernel measure --set paths --out "$OUT/verify_kernel_paths_$sha.json" \
  --commit "$(git rev-parse HEAD)" 2>&1 | tee "$LOG/bench.log" | grep -E "ctx|ceiling"

want ncu || { tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"; step done; exit 0; }
step "ncu durations ($(left) s left)"
NCU="ncu --clock-control none --cache-control none"
mine timeout 40 $NCU --metrics gpu__time_duration.sum -k regex:verify $PY ci/gpu/merge_probe.py calls --combines 2 3 \
  > "$LOG/ncu_time_merge.txt" 2>&1
grep -E "^  [a-z_ ]*verify|^  void|gpu__time_duration|^call" "$LOG/ncu_time_merge.txt" | sed 's/(VerifyParams)//'
( cd /tmp && base timeout 40 $NCU --metrics gpu__time_duration.sum -k regex:verify $PY "$KD/ci/gpu/merge_probe.py" calls \
  --combines 2 > "$LOG/ncu_time_base.txt" 2>&1 )
grep -E "^  [a-z_ ]*verify|^  void|gpu__time_duration|^call" "$LOG/ncu_time_base.txt" | sed 's/(VerifyParams)//'

step "ncu sections ($(left) s left)"
SECTIONS="--section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis --section SchedulerStats"
mine timeout 40 $NCU $SECTIONS -k regex:combine_grouped $PY ci/gpu/merge_probe.py calls --combines 3 \
  > "$LOG/ncu_sections_merge.txt" 2>&1
grep -E "^  verify|^call|Duration|DRAM Through|L2 Cache Through|L2 Hit|Achieved Occ|Warp Cycles Per Issued|Registers Per" \
  "$LOG/ncu_sections_merge.txt" | head -60
if [ "$(left)" -gt 40 ]; then
  ( cd /tmp && base timeout 40 $NCU $SECTIONS -k regex:combine $PY "$KD/ci/gpu/merge_probe.py" calls --combines 2 \
    > "$LOG/ncu_sections_base.txt" 2>&1 )
  grep -E "^  verify|^call|Duration|DRAM Through|L2 Cache Through|L2 Hit|Achieved Occ|Warp Cycles Per Issued" \
    "$LOG/ncu_sections_base.txt" | head -40
fi

if [ "$(left)" -gt 25 ]; then
  step "baseline end-to-end ($(left) s left)"
  ( cd /tmp && base timeout $(( $(left) - 5 )) $PY "$KD/ci/gpu/merge_probe.py" time --out "$OUT/base_time_$BASE_REV.json" \
    --commit "$(git -C "$BASE" rev-parse HEAD)" 2>&1 | tee "$LOG/base_time.log" )
fi

tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
step done
