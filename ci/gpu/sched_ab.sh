#!/usr/bin/env bash
# One device run of an sm90 schedule A/B (ci/gpu/sched_ab.py) from a bundle of a committed revision: the build, the
# sm90 GPU tests of the seesaw2 family (PROBE among them) with the dispatched call switched to it (FLAG), memcheck and
# racecheck of PROBE on small shapes, the A/B rows (A B B A) at the six sizes with the decode engine, then ncu of both
# at 65k (one cold launch each). $OUT gets the JSON and logs.tgz. The probe's commit brings its schedule (a name in
# cuda_backend.SCHEDULES, in the seesaw2 family's parametrised tests) and FLAG: a boolean cuda_backend attribute read
# from the environment variable KDENGINE_<FLAG> that makes pick_schedule return the probe where it returns BASE (the
# first such run, seesaw2_bulk: perf_history/kernel/bulk_12bb1ab/, its bulk.patch shows both).
#   here:   mkdir -p out/ab && git bundle create out/ab/kd.bundle HEAD
#   device: PROBE=seesaw2_bulk FLAG=SM90_BULK DEADLINE=480 bash ci/gpu/sched_ab.sh   (carry out/ab)
NAME=ab
source ci/gpu/bundle_run.sh  # the bundle's clone (entered), step / room, the build
BASE=${BASE:-seesaw2}; PROBE=${PROBE:?name the probe schedule}; FLAG=${FLAG:?name its cuda_backend switch}
step "tests + sanitizers"
(
  san memcheck m1 --path sm90_$PROBE --B 3 --T 17 --prefix 700 --nsplit 4 &
  san memcheck m2 --path sm90_$PROBE --T 3 --H 16 --prefix 70 --nsplit 2 &
  san memcheck m3 --path sm90_$PROBE --T 16 --prefix 3000 --nsplit 4 &  # two row tiles, 12 tiles a split
  san racecheck r1 --path sm90_$PROBE --T 3 --H 2 --prefix 140 &
  san racecheck r2 --path sm90_$PROBE --B 3 --T 17 --prefix 700 --nsplit 4 &
  san synccheck s1 --path sm90_$PROBE --B 2 --T 17 --prefix 300 --nsplit 3 &
  wait
  san_report
) > "$LOGS/sanitize.log" 2>&1 &
san_pid=$!
timeout 100 python3 -m pytest -q -m gpu tests/ops/test_sm90.py -k "seesaw2 and not pick" -p no:cacheprovider --maxfail=5 \
  2>&1 | tee "$LOGS/pytest_sm90.log" | tail -n 3
# the dispatched call through verify_attention and CUDA graphs with the switch on
env "KDENGINE_$FLAG=1" timeout 60 python3 -m pytest -q -m gpu tests/ops/test_sm90.py -k "graphs" -p no:cacheprovider \
  --maxfail=5 2>&1 | tee "$LOGS/pytest_sm90_flag.log" | tail -n 3
wait $san_pid
grep -E "rc=|ERROR SUMMARY|RACECHECK SUMMARY|Hazard" "$LOGS/sanitize.log" | head -20
step "A/B"
room 120 && timeout $(( DEADLINE - $(now) - ${NCU_ROOM:-60} )) python3 ci/gpu/sched_ab.py --out "$OUT/sched_ab_${PROBE}_$sha.json" \
  --rows cuda_sm90_$BASE cuda_sm90_$PROBE cuda_sm90_$PROBE cuda_sm90_$BASE --flag $FLAG \
  ${ARGS:---sizes 65536:64 65536:16 16384:64 16384:16 4096:64 4096:16 --decode 65536 16384 4096} 2>&1 \
  | grep -v Warning | tee "$LOGS/ab.log" | grep -vE "^\s*$"
step ncu
STALLS=$(printf "smsp__average_warps_issue_stalled_%s_per_issue_active.ratio," no_instruction long_scoreboard barrier wait \
  short_scoreboard gmma math_pipe_throttle mio_throttle)
STALLS=${STALLS%,}
if command -v ncu > /dev/null; then
  for T in 16 64; do
    for s in $BASE $PROBE; do
      room 30 || break 2
      # the tensor pipe (wgmma's busy cycles count in the hmma metric on this ncu; the gmma one reads n/a), and the
      # stalls per issue of the reasons that have mattered here (no_instruction: the loops' code size)
      timeout 30 ncu --clock-control none -k regex:verify_sm90 --launch-count 1 --section SpeedOfLight \
        --section WarpStateStats --section SchedulerStats \
        --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_sectors_op_write.sum,$STALLS \
        python3 -m kdengine.bench.kernel once --path sm90_$s --T $T --prefix $((65536 - T)) > "$LOGS/ncu_${s}_T$T.txt" 2>&1
      echo "--- $s 65k T=$T"
      grep -E "Duration|cycles_active|Issue Slots|DRAM Throughput|Warp Cycles Per Issued|sectors_op_write" "$LOGS/ncu_${s}_T$T.txt" | head -8
      grep -E "issue_stalled" "$LOGS/ncu_${s}_T$T.txt" | awk '{sub("smsp__average_warps_issue_stalled_", "stall "); \
        sub("_per_issue_active.ratio", ""); print "   ", $1, $2, $NF}'
    done
  done
fi
if [[ ${TIMELINE:-0} == 1 ]] && room 150; then
  # the in-kernel timeline (its own build): BASE with the L2 flushed and warm, PROBE, and the mma.sync default; each
  # repeat's records under timeline/ (block start, trigger, end per split block: which split ends last)
  step timeline
  timeout 200 python3 -m kdengine.ops.build --arch native --timeline > "$LOGS/build_timeline.log" 2>&1 \
    || tail -5 "$LOGS/build_timeline.log"
  mkdir -p "$LOGS/timeline"
  tl() { local tag=$1; shift; room 25 && timeout 60 python3 ci/gpu/timeline.py --brief --raw "$LOGS/timeline/$tag" "$@" \
    > "$LOGS/timeline_$tag.txt" 2>&1; tail -4 "$LOGS/timeline_$tag.txt"; }
  tl base
  tl base_warm --no-flush
  ( export "KDENGINE_$FLAG=1"; tl probe )
  tl mma --path mma
fi
step done
