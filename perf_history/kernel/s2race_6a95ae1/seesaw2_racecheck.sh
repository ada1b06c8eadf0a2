#!/usr/bin/env bash
# One device run for the open question of seesaw2's racecheck reports (perf_history/kernel/s2sync_dd77568/README.md):
# racecheck of seesaw2 with --racecheck-memcpy-async no (its consumer threads issue the TMA loads), and the full
# --racecheck-trace-sync log of seesaw2 and of half (racecheck-clean, same row-table helpers) on one small shape,
# so the barriers racecheck records can be compared with the kernel's. $OUT gets logs.tgz.
#   here:   mkdir -p out/final && git bundle create out/final/kd.bundle HEAD
#   device: bash ci/gpu/seesaw2_racecheck.sh   (carry out/final)
set -o pipefail
OUT=${OUT:-/tmp/s2rc-out}; LOGS=/tmp/s2rc-logs; rm -rf "$LOGS"; mkdir -p "$OUT" "$LOGS"
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
SRC=$PWD; KD=/tmp/kd-s2rc
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache
rm -rf "$KD" && git clone -q "$SRC/out/final/kd.bundle" "$KD" && cd "$KD" || exit 1
export PYTHONPATH=$KD
echo "commit $(git rev-parse --short HEAD)"; compute-sanitizer --version | tail -1
timeout 150 python3 -m kdengine.ops.build --arch native > "$LOGS/build.log" 2>&1 || { tail -20 "$LOGS/build.log"; exit 1; }
shape="--T 3 --H 2 --prefix 140"
rc() {  # tag, racecheck options...
  local tag=$1; shift
  timeout 90 compute-sanitizer --tool racecheck "$@" --show-backtrace no --error-exitcode 9 \
    python3 -m kdengine.bench.kernel once --path "sm90_${tag%%_*}" $shape > "$LOGS/$tag.log" 2>&1
  echo "$tag $* rc=$? $(grep -E 'RACECHECK SUMMARY' "$LOGS/$tag.log" | tail -1)"
}
rc seesaw2_memcpyasync_no --racecheck-memcpy-async no --print-limit 8
rc seesaw2_trace --racecheck-trace-sync yes --print-limit 0
rc half_trace --racecheck-trace-sync yes --print-limit 0
