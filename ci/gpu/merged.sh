#!/usr/bin/env bash
# One device run of a merged main on one H200 (measures exactly a committed revision, cloned from a bundle):
# build for the local arch, the verify kernel's GPU tests (both cuda paths, the default), the kernel sweep's
# peers set (the dispatched cuda call = what verify/cuda times, the mma.sync default, triton, torch, FlashMLA,
# same inputs), decode at 4k/16k/65k with the cuda backend (random routing), then, while time is left, the
# dispatched call at fixed NSPLIT beside its planner, the seesaw2 set in both orders, pytest-benchmark's A/A compares,
# ncu of the dispatched call, of the mma.sync default and of FlashMLA at 65k, the decode again (its run-to-run spread). Steps run in that order and one
# starts only when DEADLINE (seconds from the start, default 420) leaves room for it, so a run cut short
# still returns what it measured. $OUT gets the three JSON records and logs.tgz (the device tool returns at
# most 8 files: the logs travel in one tarball, packed on exit).
#   here:   mkdir -p out/final && git bundle create out/final/kd.bundle HEAD && cp .whl/sgl_flash_mla-*.whl out/final/
#   device: bash ci/gpu/merged.sh   (carry out/final)
NAME=final
source ci/gpu/bundle_run.sh  # wheels, the bundle's clone (entered), step / room, the build
step "tests + sanitizers"
(  # compute-sanitizer on small shapes of both paths, beside the tests: memcheck (one-warp merge blocks at
   # nsplit <= 8, the grouped merge past one batch, odd T and prefixes), racecheck of each sm90 schedule in use and of half,
   # seesaw2_el's synccheck (its hand-offs and the step-0 prefetch)
  san memcheck m1 --path mma --B 3 --T 17 --prefix 130 --nsplit 4 &
  san memcheck m2 --path sm90_staggered --B 3 --T 17 --prefix 130 --nsplit 4 &
  san memcheck m3 --path sm90_pair --B 2 --T 64 --prefix 700 --nsplit 4 &
  san memcheck m4 --path mma --T 3 --H 2 --prefix 2000 --nsplit 300 &
  san memcheck m5 --path sm90_half --B 3 --T 17 --prefix 130 --nsplit 4 &
  san memcheck m6 --path sm90_staggered_small --B 3 --T 17 --prefix 700 --nsplit 4 &
  san memcheck m7 --path sm90_seesaw2 --B 3 --T 17 --prefix 700 --nsplit 4 &
  san memcheck m8 --path sm90_seesaw2_el --T 16 --prefix 3000 --nsplit 4 &  # two row tiles: the step-0 prefetch runs
  wait
  san racecheck r1 --path sm90_pair --T 3 --H 2 --prefix 140 &
  san racecheck r2 --path sm90_staggered --T 3 --H 2 --prefix 140 &
  san racecheck r3 --path mma --T 3 --H 2 --prefix 140 &
  san racecheck r4 --path sm90_half --T 3 --H 2 --prefix 140 &
  san racecheck r5 --path sm90_staggered_small --T 3 --H 2 --prefix 140 &
  san racecheck r6 --path sm90_seesaw2 --T 3 --H 2 --prefix 140 &
  san racecheck r7 --path sm90_seesaw2 --B 3 --T 17 --prefix 700 --nsplit 4 &
  wait
  san racecheck r8 --path sm90_seesaw2_el --T 16 --prefix 3000 --nsplit 4 &  # the default at 32k-65k T=16 (past half the L2)
  san synccheck s1 --path sm90_seesaw2_el --B 2 --T 16 --prefix 3000 --nsplit 3 &
  wait
  san_report
) > "$LOGS/sanitize.log" 2>&1 &
san_pid=$!
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -m gpu tests/ops/test_cuda.py tests/ops/test_sm90.py tests/bench/test_kernel.py \
  -p no:cacheprovider --maxfail=10 2>&1 | tee "$LOGS/pytest_gpu.log" | grep -E "passed|failed|FAILED|Error" | head -20
wait $san_pid
grep -E "rc=|ERROR SUMMARY|RACECHECK SUMMARY|Hazard" "$LOGS/sanitize.log" | head -30
step kernel
room 60 && timeout ${KERNEL_TIMEOUT:-110} python3 -m kdengine.bench.kernel measure --set peers \
  --out "$OUT/verify_kernel_peers_$sha.json" --commit "$full" 2>&1 | tee "$LOGS/kernel.log" | tail -40
step decode
room 60 && timeout ${DECODE_TIMEOUT:-100} python3 ci/gpu/engine_decode.py --out "$OUT/engine_run_cuda_$sha.json" \
  --ctxs 4096 16384 65536 --routings random --backend cuda --steps 32 2>&1 | grep -v Warning | tee "$LOGS/decode.log"
step nsplit
room 45 && timeout $(( DEADLINE - $(now) > 90 ? 90 : DEADLINE - $(now) )) python3 -m kdengine.bench.kernel measure --set nsplit \
  --out "$OUT/verify_kernel_nsplit_$sha.json" --commit "$full" 2>&1 | tee "$LOGS/nsplit.log" | grep -E "^ctx" | tail -40
step seesaw2
# seesaw2 (the default from 128 rows) and its named-barrier form beside staggered_small (and staggered_small again:
# the A/A control), FlashMLA
# (SEESAW2_SET=<set>: another set of kdengine.bench.kernel SETS in its place, e.g. one timing a new probe)
S2SET=${SEESAW2_SET:-seesaw2}
room 50 && timeout 60 python3 -m kdengine.bench.kernel measure --set $S2SET \
  --out "$OUT/verify_kernel_${S2SET}_$sha.json" --commit "$full" 2>&1 | tee "$LOGS/seesaw2.log" | grep -E "^ctx" | tail -30
# the same set in interleaved rounds (spin gaps kept): what the order alone changes, at every size (INTERLEAVED=1;
# off by default since e2a43f3 measured it: its minute goes to the ncu of the peer)
[[ ${INTERLEAVED:-0} == 1 ]] && room 50 && timeout 60 python3 -m kdengine.bench.kernel measure --set seesaw2 --order interleaved \
  --out "$OUT/verify_kernel_seesaw2int_$sha.json" --commit "$full" 2>&1 | tee "$LOGS/seesaw2int.log" | grep -E "^ctx" | tail -30
step "pytest-benchmark A/A"
# the README's local loop on the same code, verify/cuda at the six sizes: autosave, then three compares at
# median:5% (each must pass: the sampler's statistics are GPU time per launch, spin gaps included)
if room 45; then
  PT=(python3 -m pytest tests/perf -q -p no:cacheprovider --benchmark-storage=.benchmarks/aa --benchmark-sort=name
      --benchmark-columns=median,iqr,min,max,rounds -k cuda)
  timeout 40 "${PT[@]}" --benchmark-autosave > "$LOGS/aa-save.log" 2>&1; echo "autosave: exit $?"
  for i in 1 2 3; do
    timeout 30 "${PT[@]}" --benchmark-compare --benchmark-compare-fail=median:5% > "$LOGS/aa-$i.log" 2>&1
    echo "A/A compare $i: exit $? ($(grep -cE '^test_verify.*\(NOW\)' "$LOGS/aa-$i.log") rows)"
  done
fi
step ncu
if room 40 && command -v ncu > /dev/null; then
  for T in 16 64; do
    timeout 30 ncu --clock-control none -k regex:verify --launch-count 2 --section SpeedOfLight --section Occupancy \
      --section WarpStateStats --section SchedulerStats --section LaunchStats \
      --metrics sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active \
      python3 -m kdengine.bench.kernel once --T $T --prefix $((65536 - T)) > "/tmp/ncu_T$T.txt" 2>&1
    echo "--- ncu, the dispatched call at 65k T=$T (split kernel, then the merge)"
    grep -E "verify_|Duration|cycles_active|Issue Slots|Achieved Active Warps|DRAM Throughput|Registers Per|Warp Cycles Per Issued" "/tmp/ncu_T$T.txt" | head -24
  done
  # the same sections for the mma.sync default (the sm_120 path) and for the peer's split kernel (FlashMLA)
  for T in 16 64; do
    room 25 || break
    timeout 25 ncu --clock-control none -k regex:verify --launch-count 1 --section SpeedOfLight --section Occupancy       --section WarpStateStats --section SchedulerStats --section LaunchStats       --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active       python3 -m kdengine.bench.kernel once --path mma --T $T --prefix $((65536 - T)) > "/tmp/ncu_mma_T$T.txt" 2>&1
    room 25 || break
    timeout 25 ncu --clock-control none -k regex:splitkv --launch-skip 2 --launch-count 1 --section SpeedOfLight       --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats       --metrics sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active       python3 ci/gpu/flashmla_once.py $T $((65536 - T)) > "/tmp/ncu_flashmla_T$T.txt" 2>&1
    for f in mma flashmla; do
      echo "--- ncu, $f at 65k T=$T"
      grep -E "Duration|cycles_active|Issue Slots|Achieved Active Warps|DRAM Throughput|Registers Per|Warp Cycles Per Issued" "/tmp/ncu_${f}_T$T.txt" | head -10
    done
  done
  cp /tmp/ncu_*T16.txt /tmp/ncu_*T64.txt "$LOGS/" 2>/dev/null
fi
step "source counters"
# per-SASS-line stall samples of seesaw2 at 65k T=16 (one cold launch): which mbarrier waits hold the kernel there
# (its top stall is long scoreboard: the chunk and hand-off waits; perf_history/kernel/s2t64_48c695b has T=64's)
if room 50 && command -v ncu > /dev/null; then
  rep=/tmp/src_seesaw2_T16
  timeout 40 ncu --clock-control none -k regex:verify_sm90_kernel --launch-count 1 --import-source yes \
    --section SourceCounters --section WarpStateStats --export $rep --force-overwrite \
    python3 ci/gpu/sm90_once_many.py 16 65520 seesaw2 > $rep.log 2>&1
  ncu --import $rep.ncu-rep --page source --csv --print-source sass > $rep.sass.csv 2>&1
  python3 ci/gpu/ncu_source_top.py $rep.sass.csv 40 > "$LOGS/src_seesaw2_T16.sass.top.txt" 2>&1
  gzip -f $rep.sass.csv
  python3 perf_history/kernel/s2t64_48c695b/mbar_waits.py $rep.sass.csv.gz --all > "$LOGS/src_seesaw2_T16.mbar.txt" 2>&1
  cp $rep.sass.csv.gz $rep.log "$LOGS/" 2>/dev/null
  head -12 "$LOGS/src_seesaw2_T16.mbar.txt"
fi
step "decode again"
# the decode's run-to-run spread: the same run again in a new process, last (its own record)
room 60 && timeout ${DECODE_TIMEOUT:-100} python3 ci/gpu/engine_decode.py --out "$OUT/engine_run_cuda_${sha}_rerun.json" \
  --ctxs 4096 16384 65536 --routings random --backend cuda --steps 32 2>&1 | grep -v Warning | tee "$LOGS/decode_rerun.log"
step done
