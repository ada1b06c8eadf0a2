#!/usr/bin/env bash
# A short device run of a merged main when too little device time is left for merged.sh: the build, the merge GPU
# tests (every merge after both split kernels), the kernel sweep's peers set (the record of what verify/cuda runs,
# beside the mma.sync default and FlashMLA) and the decode engine at 4k / 16k / 65k, in that order, each only while
# DEADLINE (s, default 170) leaves room. $OUT gets the records and logs.tgz.
#   here:   mkdir -p out/head && git bundle create out/head/kd.bundle HEAD && cp .whl/sgl_flash_mla-*.whl out/head/
#   device: DEADLINE=170 bash ci/gpu/head_check.sh   (carry out/head)
NAME=head
DEADLINE=${DEADLINE:-170}
source ci/gpu/bundle_run.sh  # wheels, the bundle's clone (entered), step / room, the build
step "merge tests"
timeout 40 python3 -m pytest -q -m gpu tests/ops/test_cuda.py -k "merge" -p no:cacheprovider 2>&1 \
  | tee "$LOGS/pytest_merges.log" | tail -n 2
step kernel
room 60 && timeout $(( DEADLINE - $(now) )) python3 -m kdengine.bench.kernel measure --set peers \
  --out "$OUT/verify_kernel_peers_$sha.json" --commit "$full" 2>&1 | tee "$LOGS/kernel.log" | grep -E "^ctx"
step decode
room 25 && timeout $(( DEADLINE - $(now) )) python3 ci/gpu/engine_decode.py --out "$OUT/engine_run_cuda_$sha.json" \
  --ctxs 65536 16384 4096 --routings random --backend cuda --steps 32 2>&1 | grep -v Warning | tee "$LOGS/decode.log" \
  | grep "tok/s"
step done
