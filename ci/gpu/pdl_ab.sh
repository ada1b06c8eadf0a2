#!/usr/bin/env bash
# One device run for the sm90 split kernel launched as a programmatic dependent (ci/gpu/pdl_ab.py): the sm90 GPU tests
# with it on, then the A/B and the decode engine.
#   here:   mkdir -p out/pdlsplit && git bundle create out/pdlsplit/kd.bundle HEAD
#   device: DEADLINE=300 bash ci/gpu/pdl_ab.sh   (carry out/pdlsplit)
NAME=pdlsplit
source ci/gpu/bundle_run.sh  # the bundle's clone (entered), step / room, the build
step "sm90 tests, split as a dependent"
KDENGINE_SM90_SPLIT_PDL=1 timeout 90 python3 -m pytest -q -m gpu tests/ops/test_sm90.py -k "seesaw2 or graphs or small" \
  -p no:cacheprovider 2>&1 | tee "$LOGS/pytest_pdl.log" | tail -n 2
step "pdl A/B"
room 60 && timeout $(( DEADLINE - $(now) )) python3 ci/gpu/pdl_ab.py --out "$OUT/pdl_ab_$sha.json" \
  ${ARGS:---sizes 65536:64 65536:16 16384:64 16384:16 4096:64 4096:16 --decode 65536 16384 4096} 2>&1 \
  | grep -v Warning | tee "$LOGS/pdl_ab.log" | grep -vE "^\s*$"
step done
