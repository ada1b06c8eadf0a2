#!/usr/bin/env bash
# What a verify call pays for following other kernel code (perf_history/kernel/el_8523781/switch_penalty.txt: in
# interleaved A B B A runs, a row that follows the other split kernel's code read 1.9-5.0 us slower at K = 1). Two
# interleaved sets through ci/gpu/sched_ab.py at the six sizes:
# - seesaw2 four times: every sample follows seesaw2's own code;
# - seesaw2 and seesaw2_bar alternating: every sample follows the other kernel's code (seesaw2_bar: seesaw2 with its
#   hand-offs on named barriers, the same size of code).
# seesaw2's median in the second set less the first, at K = 1 and at the sweep's K, is the cost of the cold
# instruction caches; the decode engine, where the verify call follows the model's other kernels in every layer,
# would pay it per call.
#   here:   git status --short   (a clean tree; no wheels needed)
#   device: COMMIT=<full sha> bash ci/gpu/code_switch.sh   ($OUT gets both JSONs and logs.tgz)
NAME=codeswitch
source ci/gpu/bundle_run.sh  # the tree (entered), step / room, the build
A=cuda_sm90_seesaw2; B=cuda_sm90_seesaw2_bar
SIZES=${SIZES:-65536:64 65536:16 16384:64 16384:16 4096:64 4096:16}
step "warm: A A A A"
room 90 && timeout 150 python3 ci/gpu/sched_ab.py --out "$OUT/code_switch_warm_$sha.json" --rows $A $A $A $A \
  --sizes $SIZES 2>&1 | grep -v Warning | tee "$LOGS/warm.log" | grep -E "^ctx"
step "switching: A B A B"
room 90 && timeout 150 python3 ci/gpu/sched_ab.py --out "$OUT/code_switch_cold_$sha.json" --rows $A $B $A $B \
  --sizes $SIZES 2>&1 | grep -v Warning | tee "$LOGS/cold.log" | grep -E "^ctx"
step done
