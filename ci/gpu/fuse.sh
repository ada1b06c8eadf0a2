#!/usr/bin/env bash
# One device run for the sm90 cluster merge (the merge fused into the split kernel's epilogue): build for
# the local arch, the cluster occupancy of the kernel (clusters of 1-16 blocks resident at once), smoke
# calls of the fused path that localise a wrong result (one cluster with and without distributed shared
# memory, several clusters with the merge kernel and with the in-kernel merge, clusters of 16, mostly
# empty splits; the grid merge), then alone on the GPU the timing set `fuse` (the merge kernel, the split kernel alone,
# the cluster merge at C = 2, 4, 8, 16, the grid merge; set `merge`, the first two, when a smoke call failed), then at once
# the GPU tests of the sm90 path and compute-sanitizer memcheck + racecheck of the fused paths on small
# shapes, and ncu of the split kernel with and without the grid merge. Every step is cut by `timeout`, capped so that the run ends by $DEADLINE seconds (the log
# tarball is written in any case); everything lands in $OUT (the JSON and one log tarball).
#   usage: KDENGINE_COMMIT=<sha> SM90_WHL=<sgl_flash_mla wheel> DEADLINE=200 bash ci/gpu/fuse.sh
set -o pipefail
OUT=${OUT:-/tmp/kdengine-fuse-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
status=0
DEADLINE=${DEADLINE:-200}
cap() { local left=$((DEADLINE - SECONDS)); echo $(( left < $1 ? (left > 5 ? left : 5) : $1 )); }  # step limit
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)"; }
finish() {
  tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
  step "done status=$status"
  exit $status
}
once() { $PY -m kdengine.bench.kernel once --path sm90_staggered "$@"; }

step info
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOG/smi.txt"

if [ -n "${SM90_WHL:-}" ]; then  # the FlashMLA peer
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site "$SM90_WHL" 2>&1 | tail -2
  export PYTHONPATH=/tmp/site:$PYTHONPATH
fi

step build
timeout $(cap 150) $PY -m kdengine.ops.build --arch native 2>&1 | tail -5 | tee "$LOG/build.log" || { status=1; finish; }

step feasibility  # clusters of C blocks (384 threads, ~220 KB shared memory, 1 block per SM) resident at once
timeout $(cap 30) $PY -c "
from kdengine.ops import cuda_backend as cb
import torch
print('SMs', torch.cuda.get_device_properties(0).multi_processor_count)
for c in (1, 2, 4, 8, 16):
    print(f'cluster {c:2d}: {cb.sm90_max_active_clusters(c)} clusters ({c * cb.sm90_max_active_clusters(c)} blocks)')
" 2>&1 | tee "$LOG/feasibility.txt"

step smoke
i=0
for args in "--cluster 1 --nsplit 1 --T 17 --prefix 900" "--cluster 4 --nsplit 4 --T 16 --prefix 3000" \
            "--cluster 4 --nsplit 16 --combine 3 --T 16 --prefix 3000" "--cluster 4 --nsplit 16 --T 16 --prefix 3000" \
            "--cluster 16 --T 64 --prefix 4000 --B 2" "--cluster 8 --T 1 --H 1 --prefix 63 --nsplit 64" \
            "--cluster 0 --combine 5 --T 16 --prefix 3000" "--cluster 0 --combine 5 --T 64 --prefix 4000 --B 2" \
            "--cluster 0 --combine 5 --T 1 --H 1 --prefix 63 --nsplit 64" "--cluster 0 --combine 6 --T 16 --prefix 3000"; do
  timeout $(cap 60) $PY -m kdengine.bench.kernel once --path sm90_staggered $args > "$LOG/smoke$i.log" 2>&1 &
  pids[$i]=$!
  names[$i]=$args
  i=$((i + 1))
done
smoke_ok=1
for j in "${!pids[@]}"; do
  wait "${pids[$j]}" || smoke_ok=0
  echo "${names[$j]}: $(tail -1 "$LOG/smoke$j.log")"
done
set_name=fuse
if [ $smoke_ok = 0 ]; then status=1; set_name=merge; fi

step "bench ($set_name)"
timeout $(cap 110) $PY -m kdengine.bench.kernel measure --set $set_name --out "$OUT/verify_kernel_$set_name.json" \
  --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench.log" | grep -E "ctx|ceiling|clusters" || status=1
[ $smoke_ok = 0 ] && finish

step checks  # correctness, all at once: the sm90 tests (both merges), sanitizers of the cluster merge
timeout $(cap 150) $PY -m pytest -q -m gpu tests/ops/test_sm90.py -p no:cacheprovider > "$LOG/pytest_sm90.log" 2>&1 &
t1=$!
timeout $(cap 150) compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m kdengine.bench.kernel once \
  --path sm90_staggered --cluster 4 --nsplit 8 --B 3 --T 17 --prefix 130 > "$LOG/memcheck.log" 2>&1 &
t2=$!
timeout $(cap 150) compute-sanitizer --tool racecheck --error-exitcode 9 $PY -m kdengine.bench.kernel once \
  --path sm90_staggered --cluster 4 --nsplit 8 --T 3 --H 2 --prefix 300 > "$LOG/racecheck.log" 2>&1 &
t3=$!
timeout $(cap 150) compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m kdengine.bench.kernel once \
  --path sm90_staggered --cluster 0 --combine 5 --nsplit 8 --B 3 --T 17 --prefix 130 > "$LOG/memcheck_grid.log" 2>&1 &
t4=$!
timeout $(cap 150) compute-sanitizer --tool racecheck --error-exitcode 9 $PY -m kdengine.bench.kernel once \
  --path sm90_staggered --cluster 0 --combine 5 --nsplit 8 --T 3 --H 2 --prefix 300 > "$LOG/racecheck_grid.log" 2>&1 &
t5=$!
wait $t1 || status=1
echo "--- pytest_sm90"; grep -E "passed|failed|FAILED|Error" "$LOG/pytest_sm90.log" | head -20
for pid in $t2 $t3 $t4 $t5; do wait $pid || status=1; done
for f in memcheck racecheck memcheck_grid racecheck_grid; do echo "--- $f"; tail -4 "$LOG/$f.log"; done

step ncu  # the split kernel's own duration, with and without the grid merge in its epilogue (4k and 65k, T=16)
for combine in 3 5; do
  for prefix in 4080 65520; do
    rep="$LOG/ncu_comb${combine}_p$prefix"
    timeout $(cap 25) ncu --clock-control none -k regex:verify_sm90 --launch-count 1 --section SpeedOfLight \
      --section LaunchStats $PY -m kdengine.bench.kernel once --path sm90_staggered --cluster 0 --combine $combine \
      --T 16 --prefix $prefix > "$rep.txt" 2>&1 || true
    echo "--- ncu combine $combine prefix $prefix: $(grep -E "^ +Duration" "$rep.txt" | head -1)"
  done
done
finish
