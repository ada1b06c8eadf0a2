#!/usr/bin/env bash
# One device run for merge 4 against merge 7 after the dispatched sm90 call (ci/gpu/merge_ab.py): A B B A at K = 8 calls
# per graph replay (the sweep's form) and K = 1, then the decode engine with each merge as the sm90 (or the mma.sync)
# path's (by default at 65k T=64 and T=16, and the engine at 65k, A B A on the sm90 path). Why: in the sweep merge 7 was 2.1-2.6 us slower there, in the timeline 0.4 us faster
# (perf_history/kernel/spread2_0117714/).
#   here:   mkdir -p out/mergeab && git bundle create out/mergeab/kd.bundle HEAD
#   device: DEADLINE=300 bash ci/gpu/merge_ab.sh   (carry out/mergeab)
# RUNS: one merge_ab.py argument list per run, separated by ';' (each writes merge_ab_<sha>_<i>.json); default: one
# run with merge_ab.py's defaults.
NAME=mergeab
source ci/gpu/bundle_run.sh  # the bundle's clone (entered), step / room, the build
step "merge A/B"
IFS=';' read -ra runs <<< "${RUNS:- }"
for i in "${!runs[@]}"; do
  room 60 && timeout $(( DEADLINE - $(now) )) python3 ci/gpu/merge_ab.py --out "$OUT/merge_ab_${sha}_$i.json" ${runs[$i]} \
    2>&1 | tee "$LOGS/merge_ab_$i.log" | grep -vE "^\s*$"
done
step done
