#!/usr/bin/env bash
# ncu of both cuda paths and of the peer at 65k T=16 and T=64, one cold launch each, with the figures the verify kernel
# issue asks for before / after: duration, tensor pipe active %, issue slots %, warps active per SM, DRAM %, and the
# stalls per issued instruction by reason. Kernels: the dispatched sm90 split kernel (what verify/cuda runs on Hopper),
# the mma.sync default's split kernel (the sm_120 path, run here on the H200) and FlashMLA's split kernel (its wheel
# carried in out/ncu). $OUT gets logs.tgz: one CSV per kernel and size, and table.md (ci/gpu/ncu_table.py).
#   here:   mkdir -p out/ncu && cp .whl/sgl_flash_mla-*.whl out/ncu/ (or out/peers/'s)
#   device: COMMIT=$(git rev-parse HEAD) bash ci/gpu/ncu_paths.sh   (carry out/ncu)
NAME=ncu
source ci/gpu/bundle_run.sh  # wheels, the bundle's clone or the copied tree, step / room, the build
METRICS=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
METRICS+=,sm__inst_issued.avg.pct_of_peak_sustained_active,sm__warps_active.avg.per_cycle_active
METRICS+=,gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed
for reason in wait long_scoreboard short_scoreboard barrier gmma math_pipe_throttle mio_throttle no_instruction \
    lg_throttle dispatch_stall selected; do
  METRICS+=,smsp__average_warps_issue_stalled_${reason}_per_issue_active.ratio
done
step ncu
for T in 16 64; do
  P=$((65536 - T))
  room 40 && timeout 40 ncu --csv --clock-control none -k regex:verify_sm90 --launch-count 1 --metrics $METRICS \
    python3 -m kdengine.bench.kernel once --T $T --prefix $P > "$LOGS/sm90_T$T.csv" 2> "$LOGS/sm90_T$T.err"
  room 40 && timeout 40 ncu --csv --clock-control none -k regex:verify --launch-count 1 --metrics $METRICS \
    python3 -m kdengine.bench.kernel once --path mma --T $T --prefix $P > "$LOGS/mma_T$T.csv" 2> "$LOGS/mma_T$T.err"
  room 40 && timeout 40 ncu --csv --clock-control none -k regex:splitkv --launch-skip 2 --launch-count 1 \
    --metrics $METRICS python3 ci/gpu/flashmla_once.py $T $P > "$LOGS/flashmla_T$T.csv" 2> "$LOGS/flashmla_T$T.err"
done
python3 ci/gpu/ncu_table.py "$LOGS" | tee "$LOGS/table.md"
step done
