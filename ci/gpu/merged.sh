#!/usr/bin/env bash
# One device run of a merged main on one H200 (measures exactly a committed revision, cloned from a bundle):
# build for the local arch, the verify kernel's GPU tests (both cuda paths, the default), the kernel sweep's
# peers set (mma.sync default, the sm90 path, triton, torch, FlashMLA, same inputs), then decode at 4k and 65k
# with the cuda backend (random routing). Everything lands in $OUT as at most 6 files.
#   here:   mkdir -p out/final && git bundle create out/final/kd.bundle HEAD && cp .whl/sgl_flash_mla-*.whl out/final/
#   device: bash ci/gpu/merged.sh   (carry out/final)
set -o pipefail
OUT=${OUT:-/tmp/kdengine-out}; mkdir -p "$OUT"
SRC=$PWD; KD=/tmp/kd-final
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache TRITON_DEFAULT_FP_FUSION=1
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$SRC"/out/final/*.whl || echo "FlashMLA wheel not installed"
rm -rf "$KD" && git clone -q "$SRC/out/final/kd.bundle" "$KD" && cd "$KD" || exit 1
export PYTHONPATH=/tmp/site:$KD
sha=$(git rev-parse --short HEAD); echo "commit $sha"
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm --format=csv
t0=$(date +%s); step() { echo "=== $1 ($(( $(date +%s) - t0 )) s)"; }
step build
timeout ${BUILD_TIMEOUT:-200} python3 -m kdengine.ops.build --arch native > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
step tests
timeout ${TEST_TIMEOUT:-110} python3 -m pytest -q -m gpu tests/ops/test_cuda.py tests/ops/test_sm90.py -p no:cacheprovider -x \
  2>&1 | tee "$OUT/pytest_gpu.log" | tail -6
step kernel
timeout ${KERNEL_TIMEOUT:-110} python3 -m kdengine.bench.kernel measure --set peers --out "$OUT/verify_kernel_peers_$sha.json" \
  --commit "$(git rev-parse HEAD)" 2>&1 | tee "$OUT/kernel.log" | tail -40
step decode
timeout ${DECODE_TIMEOUT:-100} python3 ci/gpu/engine_decode.py --out "$OUT/engine_run_cuda_$sha.json" --ctxs 4096 65536 \
  --routings random --backend cuda --steps 32 2>&1 | grep -v Warning | tee "$OUT/decode.log"
step done
