#!/usr/bin/env bash
# ncu of the merge kernel alone after the dispatched sm90 call (merge 7, the sm90 path's), with the partials warm in L2
# (--cache-control none: ncu serialises the launches, so the merge runs after its split kernel has finished, as in the
# graph after the release), at 65k T=64 and T=16 and 4k T=16: its duration, L2 / L1 / DRAM throughput against their
# peaks, the bytes it reads, occupancy and its warps' stalls. What bounds the ~2.4 us a merge block takes after the
# release (perf_history/kernel/ready_6e467ca/): its 8 MB of bf16 partial reads, or latency.
#   here:   git status --short   (a clean tree; no wheels needed)
#   device: COMMIT=<full sha> bash ci/gpu/merge_ncu.sh   ($OUT gets merge_ncu_T<T>_<prefix>.txt and logs.tgz)
NAME=mergencu
source ci/gpu/bundle_run.sh  # the tree (entered), step / room, the build
STALLS=$(printf "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio," long_scoreboard lg_throttle barrier wait \
  short_scoreboard no_instruction)
for spec in "64 65472" "16 65520" "16 4080"; do
  read -r T prefix <<< "$spec"
  step "ncu T=$T prefix=$prefix"
  room 40 || break
  timeout 60 ncu --cache-control none --clock-control none -k regex:combine --launch-count 2 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats \
    --metrics lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_op_read_hit_rate.pct,dram__bytes_read.sum,${STALLS%,} \
    python3 ci/gpu/merge_once.py $T $prefix 7 7 > "$OUT/merge_ncu_T${T}_$prefix.txt" 2>&1
  grep -E "Duration|Memory Throughput|L2 Cache Throughput|L1/TEX Cache Throughput|DRAM Throughput|Achieved Occupancy|sectors_srcunit|hit_rate|dram__bytes|issue_stalled|Grid Size|Registers" \
    "$OUT/merge_ncu_T${T}_$prefix.txt" | head -40
done
step done
