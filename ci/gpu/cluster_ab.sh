#!/usr/bin/env bash
# One device run for the sm90 split kernel's row tiles launched in clusters (a placement probe: ci/gpu/cluster_ab.py):
# the sm90 GPU tests of seesaw2, memcheck on a clustered call, then the A/B and the decode engine.
#   here:   mkdir -p out/cluster && git bundle create out/cluster/kd.bundle HEAD
#   device: DEADLINE=300 bash ci/gpu/cluster_ab.sh   (carry out/cluster)
# ARGS: cluster_ab.py's arguments (default: six sizes, the engine at 65k and 16k).
NAME=cluster
source ci/gpu/bundle_run.sh  # the bundle's clone (entered), step / room, the build
step "cluster A/B"
room 60 && timeout $(( DEADLINE - $(now) )) python3 ci/gpu/cluster_ab.py --out "$OUT/cluster_ab_$sha.json" \
  ${ARGS:---sizes 65536:64 65536:16 16384:64 16384:16 4096:64 4096:16 --decode 65536 16384} 2>&1 \
  | grep -v Warning | tee "$LOGS/cluster_ab.log" | grep -vE "^\s*$"
step done
