#!/usr/bin/env bash
# Device run for the CUDA verify kernel (H200 / any GPU): build for the local arch, GPU tests,
# compute-sanitizer memcheck + racecheck, ptxas resource report + SASS summary, the timing table.
# The measured JSON and the rendered table land in $OUT (default /tmp/kdengine-gpu-out); every log is
# packed into $OUT/logs.tgz at the end (the device tool returns at most 8 files).
#   usage: bash ci/gpu/cuda_kernel.sh [all|build|test|sanitize|ptxas|bench|ncu]...
set -o pipefail
OUT=${OUT:-/tmp/kdengine-gpu-out}
LOG=$OUT/logs
mkdir -p "$LOG"
export PYTHONUNBUFFERED=1
export KDENGINE_CACHE_DIR=${KDENGINE_CACHE_DIR:-/tmp/kdengine-cache}
PY=${PYTHON:-python3}
STEPS=${*:-all}
status=0

want() { [[ " $STEPS " == *" all "* || " $STEPS " == *" $1 "* ]]; }
step() { echo "=== $1 ($(date -u +%T))"; }

step info
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOG/smi.txt"
$PY -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__)"

if want build; then
  step build
  ( $PY -m kdengine.ops.build --arch native 2>&1 | tee "$LOG/build.log" ) &
  ( $PY -m kdengine.ops.build --arch native --scalar-loads 2>&1 | tee "$LOG/build_scalar.log" ) &
  wait || status=1
fi

if want ptxas; then
  step ptxas
  arch=$($PY -c "import torch; print(''.join(map(str, torch.cuda.get_device_capability())))")
  nvcc -std=c++17 -O3 -lineinfo -Xptxas -v -gencode=arch=compute_$arch,code=sm_$arch -c csrc/verify_kernel.cu \
    -o /tmp/verify_kernel.o 2>&1 | tee "$LOG/ptxas.txt"
  cuobjdump -sass /tmp/verify_kernel.o > "$LOG/verify_kernel.sass" 2>&1
  for op in LDGSTS.E.BYPASS.LTC128B.128 LDGSTS HMMA.16816.F32.BF16 LDSM.16.M88.4 LDSM.16.MT88.4 LDL STL BAR; do
    printf '%-32s %s\n' "$op" "$(grep -c "$op" "$LOG/verify_kernel.sass")"
  done | tee "$LOG/sass_counts.txt"
  grep -o "LDGSTS[.A-Z0-9_]*\|LDG[.A-Z0-9_]*\|HMMA[.A-Z0-9_]*\|LDSM[.A-Z0-9_]*" "$LOG/verify_kernel.sass" | sort | uniq -c \
    | tee -a "$LOG/sass_counts.txt"
fi

if want test; then
  step test
  $PY -m pytest -q -m gpu tests/ops -p no:cacheprovider --durations=10 2>&1 | tee "$LOG/pytest_gpu.log" || status=1
fi

if want bench; then
  step bench
  $PY -m kdengine.bench.kernel measure --out "$OUT/verify_kernel.json" --commit "${KDENGINE_COMMIT:-}" 2>&1 | tee "$LOG/bench.log" || status=1
  $PY -m kdengine.bench.kernel render "$OUT/verify_kernel.json" --out "$OUT/verify_kernel_cudagraph.txt" > /dev/null
fi

if want sanitize; then
  step sanitize
  compute-sanitizer --tool memcheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --B 3 --T 17 --prefix 130 \
    2>&1 | tail -20 | tee "$LOG/memcheck.log" || status=1
  compute-sanitizer --tool racecheck --error-exitcode 9 $PY -m kdengine.bench.kernel once --T 3 --H 2 --prefix 40 \
    2>&1 | tail -20 | tee "$LOG/racecheck.log" || status=1
fi

if want ncu; then
  step ncu
  timeout 120 ncu --clock-control none -k regex:verify_split --launch-count 1 --section SpeedOfLight \
    --section Occupancy --section MemoryWorkloadAnalysis --section ComputeWorkloadAnalysis \
    $PY -m kdengine.bench.kernel once --T 16 --prefix 65520 --nsplit 64 2>&1 | tee "$LOG/ncu.txt" || true
fi

tar czf "$OUT/logs.tgz" -C "$OUT" logs && rm -rf "$LOG"
step "done status=$status"
exit $status
