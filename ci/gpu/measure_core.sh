#!/usr/bin/env bash
# One device run for the measurement core (issue 12, items 3-4): build for the local arch (the binding's
# shape constants are checked on load), the GPU tests of kdengine.bench and the shape contract, the copy
# ceiling read three ways, `kdengine bench` over verify cuda / triton / the FlashMLA peer at the six
# sizes, the kernel sweep's peers set (perf_history/kernel JSON), then pytest-benchmark: autosave and
# three A/A compares at median:5% on the same code. Everything lands in $OUT (at most 8 files).
#   usage: KDENGINE_COMMIT=<sha> bash ci/gpu/measure_core.sh [all|aa]   (FlashMLA from .whl/ when present)
#   aa: only the pytest-benchmark A/A compares (triton + FlashMLA while the kernel builds, then cuda)
set -o pipefail
OUT=${OUT:-/tmp/kdengine-core-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
LOG=$OUT/run.log
step() { echo "=== $1 ($(date -u +%T), ${SECONDS}s)" | tee -a "$LOG"; }
status=0

step info
if ls .whl/*.whl >/dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    2>&1 | tail -3 | tee -a "$LOG"
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,temperature.gpu --format=csv 2>&1 | tee -a "$LOG"
$PY -m kdengine.ops.build --arch native > "$OUT/build.log" 2>&1 &
build_pid=$!

MODE=${1:-all}

# pytest-benchmark on the same code: autosave, then three compares at median:5% (storage under the cwd:
# pytest-benchmark 5 reports a machine_info difference with a path relative to it)
aa() {  # aa NAME KEYWORDS
  local PT=($PY -m pytest tests/perf -q -p no:cacheprovider --benchmark-storage=.benchmarks/aa-$1 --benchmark-sort=name
            --benchmark-columns=median,iqr,min,max,rounds -k "$2")
  "${PT[@]}" --benchmark-autosave > "/tmp/aa-$1-save.log" 2>&1 || return 1
  grep -E "^test_verify|passed|failed" "/tmp/aa-$1-save.log" | cut -c1-140
  local i rc bad=0
  for i in 1 2 3; do
    "${PT[@]}" --benchmark-compare --benchmark-compare-fail=median:5% > "/tmp/aa-$1-$i.log" 2>&1
    rc=$?
    grep -E "NOW|0001|regress|passed|failed|rror" "/tmp/aa-$1-$i.log" | cut -c1-140
    echo "A/A compare $i ($1): exit $rc"
    [ $rc -eq 0 ] || bad=1
  done
  return $bad
}

if [ "$MODE" = aa ]; then
  step "A/A: triton + FlashMLA while the kernel builds"
  aa triton-flashmla "(triton and not extend) or flashmla" 2>&1 | tee -a "$LOG" || status=1
  wait $build_pid || status=1
  tail -1 "$OUT/build.log" | tee -a "$LOG"
  step "A/A: cuda"
  aa cuda "cuda" 2>&1 | tee -a "$LOG" || status=1
  tar czf "$OUT/pytest_benchmark.tgz" .benchmarks /tmp/aa-*.log 2>/dev/null
  step "done status=$status"
  exit $status
fi

step "ceilings (while the kernel builds)"
$PY - <<'EOF' 2>&1 | tee -a "$LOG"
import torch
from kdengine.bench import roofline, timer
dev = torch.device("cuda")
src = torch.empty(2**29, dtype=torch.bfloat16, device=dev).normal_()
dst = torch.empty_like(src)
moved = 2 * src.numel() * src.element_size()
for name, flush, launches in (("graph copy_, 4 per replay", False, 4), ("graph copy_, 1 per replay, L2 flushed", True, 1)):
    m = timer.time_gpu(lambda i: dst.copy_(src), samples=20, launches=launches, l2_flush=flush, device=dev)
    print(f"copy {name:40s} best {moved / min(m.samples) / 1e12:.2f} TB/s  median {moved / m.median / 1e12:.2f} TB/s ({m.method})")
for name, bw in roofline.copy_bandwidth_gpu(dev).items():
    print(f"copy launched {name:32s} best {bw / 1e12:.2f} TB/s (read + write)")
c = roofline.ceilings("cuda", refresh=True)
print(f"ceiling: copy {c.copy_bytes_per_s / 1e12:.2f} TB/s, bf16 mm {c.matmul_flops_per_s / 1e12:.0f} TF/s, {c.method}")
EOF

step "gpu tests without the kernel (timer, FlashMLA against the reference)"
$PY -m pytest -q -m gpu tests/bench/test_timer.py tests/bench/test_peers.py -p no:cacheprovider 2>&1 | tail -4 | tee -a "$LOG" || status=1

wait $build_pid || status=1
tail -2 "$OUT/build.log" | tee -a "$LOG"
step "gpu tests with the kernel (binding's shape constants, one sweep case)"
$PY -m pytest -q -m gpu tests/ops/test_shapes.py tests/bench/test_kernel.py -p no:cacheprovider 2>&1 | tail -4 | tee -a "$LOG" || status=1

step "kdengine bench: verify cuda / triton / flashmla, six sizes"
$PY -c "import sys; from kdengine.cli import main; sys.exit(main(sys.argv[1:]))" bench \
  --filter '^verify(-peer)?/(cuda|triton|flashmla)/' --json "$OUT/bench.json" 2>&1 | tee -a "$LOG" || status=1

step "kernel sweep, peers set"
$PY -m kdengine.bench.kernel measure --set peers --out "$OUT/verify_kernel.json" --commit "${KDENGINE_COMMIT:-}" \
  2>&1 | tee -a "$LOG" || status=1

step "pytest-benchmark: autosave, then three A/A compares at median:5%"
aa all "cuda or (triton and not extend) or flashmla" 2>&1 | tee -a "$LOG" || status=1
tar czf "$OUT/pytest_benchmark.tgz" .benchmarks /tmp/aa-*.log 2>/dev/null
step "done status=$status"
exit $status
