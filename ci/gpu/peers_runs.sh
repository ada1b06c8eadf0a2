#!/usr/bin/env bash
# The `peers` kernel set (the dispatched cuda call, the mma.sync default, triton, torch, FlashMLA on the same inputs;
# SET=<set>: another set of kdengine.bench.kernel, e.g. merge: the sm90 call with and without its merge)
# RUNS times (default 3), each in its own process, from a bundle (or the copied tree as COMMIT): the run-to-run spread of
# every row and of the ratio to FlashMLA, which moves by ~3% between runs while ours moves by ~1% (README). $OUT gets
# the RUNS JSON records (ci/gpu/targets.py reads all the records of the latest commit) and logs.tgz.
#   here:   mkdir -p out/peers && cp .whl/sgl_flash_mla-*.whl out/peers/ (+ git bundle create out/peers/kd.bundle HEAD,
#           or COMMIT=$(git rev-parse HEAD) on the device with a clean tree)
#   device: RUNS=3 bash ci/gpu/peers_runs.sh   (carry out/peers)
NAME=peers
source ci/gpu/bundle_run.sh  # wheels, the bundle's clone (entered) or the copied tree, step / room, the build
for i in $(seq 1 "${RUNS:-3}"); do
  step "${SET:-peers} run $i"
  room 45 || break  # a run took 18-26 s on the H200
  timeout $(( DEADLINE - $(now) )) python3 -m kdengine.bench.kernel measure --set "${SET:-peers}" \
    --out "$OUT/verify_kernel_${SET:-peers}_r${i}_$sha.json" --commit "$full" 2>&1 | grep -v Warning > "$LOGS/${SET:-peers}_$i.log"
  grep -E "^ctx.*(cuda |flashmla|sm90)" "$LOGS/${SET:-peers}_$i.log"
done
step done
