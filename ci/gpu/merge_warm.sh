#!/usr/bin/env bash
# The merge kernels timed alone with their inputs warm in L2 (ncu --cache-control none: ncu serialises the launches,
# so each merge runs after its split kernel has finished and left the partials in L2), ours beside FlashMLA's combine,
# at 65k T=64 and T=16 and 4k T=16. The in-graph share of our merge (split + merge against split alone) is 2.6-4.2 us
# (perf_history/kernel/pdl_288100a/pdl.log); this says how much of that is the merge kernel's own run.
#   usage (device, from a clone of the commit; wheels in /tmp/site): bash ci/gpu/merge_warm.sh > $OUT/merge_warm.log
set -o pipefail
python3 -m kdengine.ops.build --arch native 2>&1 | tail -1
for spec in "64 65472" "16 65520" "16 4080"; do
  read -r T prefix <<< "$spec"
  echo "=== T=$T prefix=$prefix"
  for what in ours flashmla; do
    if [ $what = ours ]; then cmd=(python3 ci/gpu/sm90_once_many.py $T $prefix seesaw2 seesaw2 seesaw2)
    else cmd=(python3 ci/gpu/flashmla_once.py $T $prefix); fi
    timeout 120 ncu --cache-control none --clock-control none --csv --metrics gpu__time_duration.sum,lts__t_sectors_srcunit_tex_op_read.sum,dram__bytes_read.sum \
      "${cmd[@]}" 2>/dev/null | python3 ci/gpu/ncu_metrics.py - | sed "s/^/$what /"
  done
done
