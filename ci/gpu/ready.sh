#!/usr/bin/env bash
# One device run for the ready merge (merge 8, cuda_backend.READY_COMBINE: per-split flags in place of the split grid's
# completion, launched at the split kernel's start) against merge 7 after the dispatched sm90 call: the build, the sm90
# GPU tests of the merge (ready, graphs, reference), memcheck / racecheck / synccheck of a ready call, ci/gpu/merge_ab.py
# --merges 7 8 (A B B A at the sweep's K and at K = 1, all six sizes, then the decode engine 7 8 8 7 at 65k / 16k /
# 4k), the `ready` kernel set (both merges, the split kernel alone, FlashMLA: one sequential pass), and, while DEADLINE
# allows, the timeline build and the in-kernel timeline of both merges at 65k.
#   here:   rm -rf out/ready && mkdir -p out/ready && cp .whl/sgl_flash_mla-*.whl out/ready/ && git status --short
#   device: COMMIT=<full sha of the clean tree> DEADLINE=540 bash ci/gpu/ready.sh   (carry out/ready)
NAME=ready
source ci/gpu/bundle_run.sh  # wheels, the tree (entered), step / room, the build
step "tests + sanitizers"
(
  san memcheck m1 --path sm90_seesaw2 --combine 8 --B 3 --T 17 --prefix 700 --nsplit 4 &
  san memcheck m2 --path sm90_staggered_small --combine 8 --T 3 --H 16 --prefix 70 --nsplit 5 &
  san memcheck m3 --path sm90_seesaw2 --combine 8 --T 16 --prefix 3000 --nsplit 40 &  # empty splits
  san racecheck r1 --path sm90_seesaw2 --combine 8 --B 3 --T 17 --prefix 700 --nsplit 4 &
  san synccheck s1 --path sm90_seesaw2 --combine 8 --B 2 --T 17 --prefix 300 --nsplit 3 &
  wait
  san_report
) > "$LOGS/sanitize.log" 2>&1 &
san_pid=$!
timeout 150 python3 -m pytest -q -m gpu tests/ops/test_sm90.py -k "ready or graphs or matches_reference" \
  -p no:cacheprovider --maxfail=5 2>&1 | tee "$LOGS/pytest_sm90.log" | tail -n 3
wait $san_pid
grep -E "rc=|ERROR SUMMARY|RACECHECK SUMMARY|Hazard" "$LOGS/sanitize.log" | head -20
step "merge A/B"
room 150 && timeout $(( DEADLINE - $(now) - ${TAIL_ROOM:-100} )) python3 ci/gpu/merge_ab.py --merges 7 8 \
  --out "$OUT/merge_ab_ready_$sha.json" --sizes ${SIZES:-65536:64 65536:16 16384:64 16384:16 4096:64 4096:16} \
  --decode ${DECODE:-65536 16384 4096} --decode-merges 7 8 8 7 2>&1 | grep -v Warning | tee "$LOGS/merge_ab.log"
step "ready set"
room 50 && timeout 80 python3 -m kdengine.bench.kernel measure --set ready --out "$OUT/verify_kernel_ready_$sha.json" \
  --commit "$full" 2>&1 | grep -v Warning | tee "$LOGS/ready.log" | grep -E "^ctx" | cut -c1-110
step timeline
if room 150; then
  timeout 140 python3 -m kdengine.ops.build --arch native --timeline > "$LOGS/build_timeline.log" 2>&1 || tail -5 "$LOGS/build_timeline.log"
  for c in 7 8; do
    room 25 && timeout 40 python3 ci/gpu/timeline.py --brief --combine $c --raw "$LOGS/raw_c$c" 2>&1 | grep -v Warning \
      | tee "$LOGS/timeline_c$c.txt" | grep -E "^ctx|release|merge work|last split end ->|spread"
  done
fi
step done
