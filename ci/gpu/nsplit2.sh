#!/usr/bin/env bash
# One device run of the `nsplit2` kernel set from a bundle of a committed revision: both cuda paths (the sm90 kernel the
# dispatched call runs on Hopper, the mma.sync default) at a finer grid of fixed split counts (kernel.nsplit_grid: every
# count of non-empty splits the kernel can run from auto / 4 up to one wave, thinned) between two rows of the planner's
# own count (auto, and auto again: the run's A/A pair), at the six sizes; PASSES sets (default 2) while DEADLINE allows.
# $OUT gets each pass's JSON and logs.tgz (each pass's table of auto against the best fixed count in nsplit2_<i>.log).
#   here:   mkdir -p out/nsplit2 && git bundle create out/nsplit2/kd.bundle HEAD
#   device: bash ci/gpu/nsplit2.sh   (carry out/nsplit2)
NAME=nsplit2
source ci/gpu/bundle_run.sh  # the bundle's clone (entered), step / room, the build
for i in $(seq 1 "${PASSES:-2}"); do
  step "nsplit2 pass $i"
  room 90 || break  # a pass took 46 s on the H200
  timeout $(( DEADLINE - $(now) )) python3 -m kdengine.bench.kernel measure --set nsplit2 \
    --out "$OUT/verify_kernel_nsplit2_${i}_$sha.json" --commit "$full" 2>&1 | grep -v Warning > "$LOGS/measure_$i.log"
  tail -n 3 "$LOGS/measure_$i.log"
  python3 -m kdengine.bench.kernel render "$OUT/verify_kernel_nsplit2_${i}_$sha.json" > "$LOGS/nsplit2_$i.log" 2>&1
  grep -A 20 "auto NSPLIT against" "$LOGS/nsplit2_$i.log"
done
step done
