#!/usr/bin/env bash
# One device run for the merge probe combine 7 (the grouped merge with its blocks spread over the SMs): the build
# (and the timeline build beside the checks), smoke calls of merge 7 after both split kernels with their rel L2, the GPU
# merge tests (every combine), memcheck of merge 7, the kernel sweep set `spread` twice (merge 4, 7, 7, 4 after the
# dispatched sm90 call, the mma.sync default with 4 and 7, FlashMLA), then the merge timeline at 65k with 4 and 7 after
# both split kernels (the sm90 call and the mma.sync default)
# (on how many SMs the merge's blocks ran, and how long their work after the wait release took), over TL_REPEATS replays
# (default 20; the run at 591e4a6 recorded 3 each, too few to place merge 7's 65k T=64 loss).
#   here:   mkdir -p out/spread && git bundle create out/spread/kd.bundle HEAD && cp .whl/sgl_flash_mla-*.whl out/spread/
#   device: DEADLINE=330 bash ci/gpu/spread.sh   (carry out/spread)
NAME=spread
source ci/gpu/bundle_run.sh  # wheels, the bundle's clone (entered), step / room, the build
( timeout 150 python3 -m kdengine.ops.build --arch native --timeline > "$LOGS/build_timeline.log" 2>&1
  echo "timeline build rc=$?" >> "$LOGS/build_timeline.log" ) &
tl_build=$!
step "smoke + tests + memcheck"
for shape in "--B 2 --T 64 --prefix 700" "--B 3 --T 17 --prefix 130 --nsplit 4" "--T 16 --prefix 65000" "--T 3 --H 16 --prefix 70 --nsplit 300"; do
  for path in sm90_seesaw2 mma; do
    echo "$path $shape: $(timeout 40 python3 -m kdengine.bench.kernel once --path $path --combine 7 $shape 2>&1 | tail -1)"
  done
done | tee "$LOGS/smoke.log"
timeout 100 python3 -m pytest -q -m gpu tests/ops/test_cuda.py -k "both_merges" -p no:cacheprovider > "$LOGS/pytest_merges.log" 2>&1 &
t1=$!
for shape in "--B 3 --T 17 --prefix 130 --nsplit 4" "--T 3 --H 16 --prefix 70 --nsplit 300"; do
  for path in sm90_seesaw2 mma; do
    timeout 90 compute-sanitizer --tool memcheck --print-limit 2 --error-exitcode 9 \
      python3 -m kdengine.bench.kernel once --path $path --combine 7 $shape > /tmp/san_${path}_$RANDOM.txt 2>&1
    echo "memcheck $path combine 7 $shape rc=$?"
  done
done | tee "$LOGS/sanitize.log"
wait $t1; tail -n 3 "$LOGS/pytest_merges.log"
for i in 0 1; do
  step "kernel set spread $i"
  room 60 && timeout 90 python3 -m kdengine.bench.kernel measure --set spread --trees 16,64 \
    --out "$OUT/verify_kernel_spread${i}_$sha.json" --commit "$full" 2>&1 | tee "$LOGS/spread$i.log" | grep -E "ctx|ceiling"
done
wait $tl_build; tail -n 2 "$LOGS/build_timeline.log"
for path in sm90 mma; do
  for c in 4 7; do
    step "timeline $path combine $c"
    sizes=65536:16,65536:64; [[ $path == mma ]] && sizes=4096:16,65536:64  # (mma: where merge 7 was faster, and 65k)
    room 30 && timeout 60 python3 ci/gpu/timeline.py --path $path --combine $c --sizes $sizes \
      --repeats ${TL_REPEATS:-20} --brief --raw "$LOGS/timeline_raw" > "$LOGS/timeline_${path}_c$c.txt" 2>&1
    cat "$LOGS/timeline_${path}_c$c.txt"
  done
done
room 60 && { step "kernel set spread 2"; timeout 90 python3 -m kdengine.bench.kernel measure --set spread --trees 16,64 \
  --out "$OUT/verify_kernel_spread2_$sha.json" --commit "$full" 2>&1 | tee "$LOGS/spread2.log" | grep -E "ctx|ceiling"; }
step done
