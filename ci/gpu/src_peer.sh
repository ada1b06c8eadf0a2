#!/usr/bin/env bash
# Per-SASS-line stall samples and the opcode mix of both split kernels at 65k T=64 and T=16, ours (seesaw2) beside
# FlashMLA's, one cold launch each (ncu SourceCounters; ci/gpu/ncu_source_top.py): where FlashMLA's tensor pipe gains
# its 5-6 points over ours (perf_history/kernel/merge_src_b420133/: its "wait" and "gmma" stalls per issue are 0.9 and
# 0.1 against our 1.9 and 0.9).
#   usage (device, from a clone of the commit; sgl-flash-mla in /tmp/site): OUT=... bash ci/gpu/src_peer.sh
set -o pipefail
L=$OUT/logs; mkdir -p "$L"
python3 -m kdengine.ops.build --arch native 2>&1 | tail -1
for T in 64 16; do
  prefix=$((65536 - T))
  for who in ours flashmla; do
    rep=$L/src_${who}_T$T
    if [ $who = ours ]; then cmd=(python3 ci/gpu/sm90_once_many.py $T $prefix seesaw2); k=regex:verify_sm90; skip=0
    else cmd=(python3 ci/gpu/flashmla_once.py $T $prefix); k=regex:splitkv; skip=2; fi
    timeout 100 ncu --clock-control none -k $k --launch-skip $skip --launch-count 1 --import-source yes \
      --section SourceCounters --section WarpStateStats --export $rep --force-overwrite "${cmd[@]}" > $rep.log 2>&1
    ncu --import $rep.ncu-rep --page source --csv --print-source sass > $rep.sass.csv 2>/dev/null
    rm -f $rep.ncu-rep
    python3 ci/gpu/ncu_source_top.py $rep.sass.csv 40 > $rep.top.txt 2>&1
    gzip -f $rep.sass.csv
    echo "=== $who T=$T"; head -12 $rep.top.txt; tail -3 $rep.top.txt
  done
done
