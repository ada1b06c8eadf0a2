#!/usr/bin/env bash
# One device run for the grouped merge with fewer instructions (combine 4) against the default (3): the merge GPU tests,
# the sweep set `merge2` twice (each merge after the dispatched sm90 split kernel and after the mma.sync default, the
# split kernel alone, the default again as the A/A control), ncu of both merge kernels with warm partials at 65k T=64 /
# T=16 (duration, warp instructions, issue slots), compute-sanitizer memcheck and racecheck of combine 4.
#   here:   rm -rf out/merge2 && mkdir -p out/merge2 && git bundle create out/merge2/kd.bundle HEAD &&
#           cp .whl/{sgl_flash_mla,asv_runner,gitpython,gitdb,smmap}-*.whl out/merge2/
#   device: bash ci/gpu/merge2.sh   (carry out/merge2)
NAME=merge2
source ci/gpu/bundle_run.sh  # wheels, the bundle's clone (entered), step / room, the build
step "merge tests"
room 60 && timeout 150 python3 -m pytest -q -m gpu tests/ops/test_cuda.py tests/ops/test_sm90.py -k "merge or combine" \
  -p no:cacheprovider 2>&1 | tee "$LOGS/pytest_merge.log" | grep -E "passed|failed|FAILED|Error" | head -20
for k in 0 1; do
  step "merge2 set $k"
  room 50 && timeout 80 python3 -m kdengine.bench.kernel measure --set merge2 --out "$OUT/verify_kernel_merge2${k}_$sha.json" \
    --commit "$full" 2>&1 | tee "$LOGS/merge2_$k.log" | grep -E "^ctx" | sed 's/  */ /g' | cut -c1-110
done
step "ncu (warm partials)"
for spec in "64 65472" "16 65520" "16 4080"; do
  read -r T prefix <<< "$spec"
  room 30 && timeout 60 ncu --cache-control none --clock-control none -k regex:verify_combine --csv \
    --metrics gpu__time_duration.sum,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active \
    python3 ci/gpu/merge_once.py $T $prefix 3 4 3 4 > "$LOGS/ncu_merge_T${T}_$prefix.csv" 2>&1
  echo "--- T=$T prefix=$prefix"; grep -E "^\"" "$LOGS/ncu_merge_T${T}_$prefix.csv" | grep -v "Metric Name" \
    | awk -F'","' '{print $5, $(NF-2), $NF}' | sed 's/(kdengine::VerifyParams)//; s/"//g'
  grep "rel L2" "$LOGS/ncu_merge_T${T}_$prefix.csv"
done
step "sanitizers"
for tool in memcheck racecheck; do
  for args in "16 65520 4" "3 300 4"; do
    room 30 && timeout 90 compute-sanitizer --tool $tool --error-exitcode 9 python3 ci/gpu/merge_once.py $args \
      > "$LOGS/san_${tool}_${args// /_}.log" 2>&1
    echo "--- $tool $args rc=$? $(grep -hE "ERROR SUMMARY|RACECHECK SUMMARY" "$LOGS/san_${tool}_${args// /_}.log" | head -1)"
  done
done
step done
