#!/usr/bin/env bash
# Where the merge kernel's time goes (warm, ncu source counters) and the split kernels' instruction and stall profile
# beside FlashMLA's (cold, one launch each) at 65k T=64 and T=16. Follows ci/gpu/merge_warm.sh.
#   usage (device, from a clone of the commit; wheels in /tmp/site): OUT=... bash ci/gpu/merge_src.sh
set -o pipefail
L=$OUT/logs; mkdir -p "$L"
python3 -m kdengine.ops.build --arch native 2>&1 | tail -1
STALLS=$(for r in wait long_scoreboard short_scoreboard barrier gmma math_pipe_throttle mio_throttle dispatch_stall \
          not_selected selected no_instruction branch_resolving lg_throttle membar; do
          printf 'smsp__average_warps_issue_stalled_%s_per_issue_active.ratio,' $r; done)
METRICS="${STALLS}sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,\
smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,smsp__inst_executed.sum,\
smsp__inst_executed_op_shared_ld.sum,smsp__inst_executed_op_shared_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared.sum"
for T in 64 16; do
  prefix=$((65536 - T))
  rep=$L/merge_src_T$T
  timeout 90 ncu --cache-control none --clock-control none -k regex:verify_combine --launch-skip 1 --launch-count 1 \
    --import-source yes --section SourceCounters --section WarpStateStats --section SchedulerStats --export $rep --force-overwrite \
    python3 ci/gpu/sm90_once_many.py $T $prefix seesaw2 seesaw2 > $rep.log 2>&1
  ncu --import $rep.ncu-rep --page source --csv --print-source sass > $rep.sass.csv 2>/dev/null
  ncu --import $rep.ncu-rep > $rep.txt 2>&1
  rm -f $rep.ncu-rep
  python3 ci/gpu/ncu_source_top.py $rep.sass.csv 30 > $rep.top.txt 2>&1
  gzip -f $rep.sass.csv
  echo "=== merge T=$T"; head -32 $rep.top.txt; tail -3 $rep.top.txt
  for who in ours flashmla; do
    rep=$L/split_${who}_T$T
    if [ $who = ours ]; then cmd=(python3 ci/gpu/sm90_once_many.py $T $prefix seesaw2); k=regex:verify_sm90; skip=0
    else cmd=(python3 ci/gpu/flashmla_once.py $T $prefix); k=regex:splitkv; skip=2; fi
    timeout 90 ncu --clock-control none -k $k --launch-skip $skip --launch-count 1 --metrics "$METRICS" --csv \
      "${cmd[@]}" > $rep.csv 2>&1
    echo "=== split $who T=$T"
    python3 ci/gpu/ncu_metrics.py $rep.csv --stalls
  done
done
