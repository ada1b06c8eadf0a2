#!/usr/bin/env bash
# One device run for the verify merge (issue 12) on one H200: this branch and a baseline revision of
# the same bundle (BASE_REV) built side by side; the GPU tests of both cuda paths with compute-sanitizer
# memcheck + racecheck of both paths beside them; the timing set `paths` (both paths' defaults and
# FlashMLA) at the six sizes; ncu of the merge: kernel durations of split + merge at 65k T=16 / T=64
# with the caches as the split kernel left them (one pass), then the analysis sections, for this branch
# and the baseline; the baseline's end-to-end times last, while the budget lasts.
#   here:   mkdir -p out/merge && git bundle create out/merge/kd.bundle HEAD && cp .whl/sgl_flash_mla-*.whl out/merge/
#   device: S=$PWD; git clone -q out/merge/kd.bundle /tmp/kd && cd /tmp/kd && SRC=$S bash ci/gpu/merge.sh
set -o pipefail
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
rm -rf "$BASE" && git clone -q "$SRC/out/merge/kd.bundle" "$BASE" && git -C "$BASE" checkout -q "$BASE_REV" || exit 1

step build
( cd /tmp && base timeout 170 $PY -m kdengine.ops.build --arch native > "$LOG/build_base.log" 2>&1 ) &
base_build=$!
mine timeout 170 $PY -m kdengine.ops.build --arch native > "$LOG/build.log" 2>&1 || { tail -30 "$LOG/build.log"; exit 1; }
tail -1 "$LOG/build.log"

step "tests + sanitizers"
(
  for path in mma sm90_staggered; do
    mine timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --path $path \
      --B 3 --T 17 --prefix 130 2>&1 | tail -3
    echo "memcheck $path B=3 T=17 prefix=130 rc=$?"
    mine timeout 40 compute-sanitizer --tool racecheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --path $path \
      --T 3 --H 2 --prefix 140 2>&1 | tail -3
    echo "racecheck $path T=3 H=2 prefix=140 rc=$?"
  done
  # the grouped merge past one batch per warp (nsplit 300: 16 warps, 3 batches)
  mine timeout 40 compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --path mma \
    --T 3 --H 2 --prefix 2000 --nsplit 300 2>&1 | tail -3
  echo "memcheck mma T=3 H=2 prefix=2000 nsplit=300 rc=$?"
) > "$LOG/sanitize.log" 2>&1 &
sanitize=$!
mine timeout 90 $PY -m pytest -q -m gpu tests/ops/test_cuda.py tests/ops/test_sm90.py -p no:cacheprovider --maxfail=20 \
  2>&1 | tee "$LOG/pytest_gpu.log" | grep -E "passed|failed|FAILED|Error" | head -30
wait $sanitize
grep -E "rc=|SUMMARY" "$LOG/sanitize.log"
wait $base_build
tail -1 "$LOG/build_base.log"

step "bench paths ($(left) s left)"
mine timeout 70 $PY -m kdengine.bench.kernel measure --set paths --out "$OUT/verify_kernel_paths_$sha.json" \
  --commit "$(git rev-parse HEAD)" 2>&1 | tee "$LOG/bench.log" | grep -E "ctx|ceiling"

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
