#!/usr/bin/env bash
# What bounds the mma.sync path on this GPU (issue 12's mma.sync targets; the path sm_120 runs): the mma.sync ceiling
# (ci/gpu/mma_peak.cu: m16n8k16 bf16 -> fp32 chains from registers and fed by ldmatrix, at 4-32 warps per SM), ncu's
# tensor (hmma) pipe % of each line (so the path's own ncu figure, 41.6% at 65k T=64 in mma8_e949c85/, converts to a
# share of that ceiling).
#   here:   git status --short   (a clean tree; no wheels needed)
#   device: COMMIT=<full sha> bash ci/gpu/mma_peak.sh   ($OUT gets mma_peak.txt, mma_peak_ncu.txt and logs.tgz)
NAME=mmapeak
source ci/gpu/bundle_run.sh  # the tree (entered), step / room, the build
step "mma_peak"
cap=$(python3 -c "import torch; p = torch.cuda.get_device_capability(); print(f'{p[0]}{p[1]}' + ('a' if p[0] == 9 else ''))")
nvcc -O3 -std=c++17 -gencode=arch=compute_$cap,code=sm_$cap -Icsrc ci/gpu/mma_peak.cu -o /tmp/mma_peak 2>&1 | tail -5
timeout 120 /tmp/mma_peak 4096 | tee "$OUT/mma_peak.txt"
step "ncu of every mma_peak line"
# every launch of every line (6 a line: the warm-up and 5 timed; 24 lines), at 1024 iterations a launch
room 60 && timeout 90 ncu --clock-control none -k regex:mma_loop --launch-count 144 \
  --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__inst_executed_pipe_tensor_op_hmma.avg.pct_of_peak_sustained_active,smsp__issue_active.avg.pct_of_peak_sustained_active,gpu__time_duration.sum,launch__block_size,launch__grid_size \
  /tmp/mma_peak 1024 > "$OUT/mma_peak_ncu.txt" 2>&1
grep -E "mma_loop|hmma|issue_active|duration|block_size" "$OUT/mma_peak_ncu.txt" | head -60 | cut -c1-150
step done
