#!/usr/bin/env bash
# One device run: does compute-sanitizer racecheck accept seesaw2 with its four warpgroup hand-offs on mbarriers
# (schedule seesaw2), where it reports the same kernel with them on named barriers (seesaw2_bar)? And what do the
# mbarriers cost? Steps: build; the minimal kernels of ci/gpu/racecheck_repro.cu (variants 6-9 reproduce seesaw2's
# barrier sequence with named barriers and with mbarriers); racecheck of seesaw2, seesaw2_bar and staggered_small
# on three small shapes, memcheck and synccheck of seesaw2; the seesaw2 GPU tests; then alone on the GPU the
# timing set `seesaw2` (staggered_small, seesaw2, seesaw2_bar, staggered_small again: the A/A control, FlashMLA).
#   here:   mkdir -p out/final && git bundle create out/final/kd.bundle HEAD && cp .whl/sgl_flash_mla-*.whl out/final/
#   device: bash ci/gpu/s2race.sh   (carry out/final; REPRO=0 / TIMING=0 skip those steps, SCHEDS picks the racechecked schedules)
set -o pipefail
OUT=${OUT:-/tmp/s2race-out}; LOGS=/tmp/s2race-logs; rm -rf "$LOGS"; mkdir -p "$OUT" "$LOGS"
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
SRC=$PWD; KD=/tmp/kd-s2race
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$SRC"/out/final/*.whl || echo "FlashMLA wheel not installed"
rm -rf "$KD" && git clone -q "$SRC/out/final/kd.bundle" "$KD" && cd "$KD" || exit 1
export PYTHONPATH=/tmp/site:$KD
sha=$(git rev-parse --short HEAD); full=$(git rev-parse HEAD); echo "commit $sha"; compute-sanitizer --version | tail -1
timeout 200 python3 -m kdengine.ops.build --arch native > "$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; exit 1; }
echo "=== built ($SECONDS s)"
if [ "${REPRO:-1}" = 1 ]; then
  OUT=$LOGS timeout 120 bash ci/gpu/racecheck_repro.sh > /dev/null 2>&1
  grep -E "variant|SUMMARY|Race" "$LOGS/racecheck_repro.txt" | grep -vE "^\s*$" | head -40
fi
san() {  # tool tag path shape...
  local tool=$1 tag=$2; shift 2
  timeout 90 compute-sanitizer --tool $tool --print-limit 4 --show-backtrace no --error-exitcode 9 \
    python3 -m kdengine.bench.kernel once "$@" > "$LOGS/san_$tag.log" 2>&1
  echo "$tool $* rc=$? | $(grep -E 'SUMMARY' "$LOGS/san_$tag.log" | tail -1)"
}
(
  for sched in ${SCHEDS:-seesaw2 seesaw2_bar staggered_small}; do
    san racecheck ${sched}_a --path sm90_$sched --T 3 --H 2 --prefix 140 &
    san racecheck ${sched}_b --path sm90_$sched --T 64 --prefix 700 --nsplit 2 &
    san racecheck ${sched}_c --path sm90_$sched --B 3 --T 17 --prefix 700 --nsplit 4 &
    wait
  done
  san memcheck s2_m --path sm90_seesaw2 --B 3 --T 17 --prefix 700 --nsplit 4 &
  san synccheck s2_s --path sm90_seesaw2 --T 64 --prefix 700 --nsplit 2 &
  wait
) > "$LOGS/sanitize.log" 2>&1 &
pid=$!
timeout 150 python3 -m pytest -q -m gpu tests/ops/test_sm90.py -k "seesaw2" -p no:cacheprovider 2>&1 | tee "$LOGS/pytest.log" | tail -3
wait $pid; cat "$LOGS/sanitize.log"
[ "${TIMING:-1}" = 1 ] || exit 0
echo "=== timing ($SECONDS s)"
timeout 90 python3 -m kdengine.bench.kernel measure --set seesaw2 --out "$OUT/verify_kernel_s2race_$sha.json" --commit "$full" \
  2>&1 | tee "$LOGS/bench.log" | grep -E "^ctx" | tail -40
echo "=== done ($SECONDS s)"
