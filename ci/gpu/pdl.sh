#!/usr/bin/env bash
# One device run: when a split kernel lets the merge launch (cuda_backend.DEFAULT_MERGE_EARLY for the sm90 kernel,
# DEFAULT_MMA_MERGE_EARLY for the mma.sync default; kernel sweep set `pdl`: each default, its other choice, the
# default again as the A/A control, and the sm90 split kernel alone; sequential, then interleaved rounds), after the
# GPU tests (every `-m gpu` test), and the sweep / suite agreement at 4k (ci/gpu/frontends.py). (Its runs at 6268674
# and 288100a also ran the binding's checks, now ci/gpu/binding.sh.) Steps start only while DEADLINE (s, default 420) leaves room; logs are packed after every step.
#   here:   rm -rf out/pdl && mkdir -p out/pdl && git bundle create out/pdl/kd.bundle HEAD &&
#           cp .whl/{sgl_flash_mla,asv_runner,gitpython,gitdb,smmap}-*.whl out/pdl/   (the GPU tests' imports)
#   device: bash ci/gpu/pdl.sh   (carry out/pdl)
NAME=pdl
source ci/gpu/bundle_run.sh  # wheels, the bundle's clone (entered), step / room, the build
step "GPU tests"
[[ ${TESTS:-1} == 1 ]] && room 100 && timeout ${TEST_TIMEOUT:-200} python3 -X faulthandler -m pytest -q -m gpu tests -p no:cacheprovider \
  --continue-on-collection-errors --durations=10 2>&1 | tee "$LOGS/pytest_gpu.log" | grep -E "passed|failed|FAILED|Error|Fatal" | head -20
step "pdl sequential"
room 60 && timeout 90 python3 -m kdengine.bench.kernel measure --set pdl --out "$OUT/verify_kernel_pdl_$sha.json" \
  --commit "$full" 2>&1 | tee "$LOGS/pdl.log" | grep -E "^ctx" | cut -c1-120
step "pdl interleaved"
room 60 && timeout 90 python3 -m kdengine.bench.kernel measure --set pdl --order interleaved \
  --out "$OUT/verify_kernel_pdlint_$sha.json" --commit "$full" 2>&1 | tee "$LOGS/pdlint.log" | grep -E "^ctx" | cut -c1-120
step "front ends at 4k"
room 60 && timeout 120 python3 ci/gpu/frontends.py --out "$OUT/frontends_$sha.json" 2>&1 | tee "$LOGS/frontends.log" \
  | grep -E "^ctx4096 T[0-9]+ (sweep|suite)"
step done
