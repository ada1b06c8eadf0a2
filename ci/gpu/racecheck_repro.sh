#!/usr/bin/env bash
# compute-sanitizer racecheck on the minimal hand-off kernels of ci/gpu/racecheck_repro.cu (variants 0-9,
# described there): which block shapes make racecheck report a race-free named-barrier hand-off.
#   usage: bash ci/gpu/racecheck_repro.sh   (writes $OUT/racecheck_repro.txt)
set -o pipefail
OUT=${OUT:-/tmp/kdengine-repro-out}; mkdir -p "$OUT"
nvcc -std=c++17 -O3 -lineinfo -Xptxas -v -gencode=arch=compute_90a,code=sm_90a ci/gpu/racecheck_repro.cu \
  -o /tmp/racecheck_repro > /tmp/racecheck_repro_build.txt 2>&1 || { cat /tmp/racecheck_repro_build.txt; exit 1; }
{
  grep -E "Used|C75" /tmp/racecheck_repro_build.txt
  for v in ${VARIANTS:-0 1 2 3 4 5 6 7 8 9}; do
    /tmp/racecheck_repro $v
    timeout 60 compute-sanitizer --tool racecheck --racecheck-report all --print-limit 4 /tmp/racecheck_repro $v 2>&1 |
      grep -E "variant|Race reported|Access|SUMMARY|Error|Warning" | head -12
    echo "--- variant $v done"
  done
} 2>&1 | tee "$OUT/racecheck_repro.txt"
