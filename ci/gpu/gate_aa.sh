#!/usr/bin/env bash
# The gate on a real GPU, made with the main job itself: `python -m ci perf` at a list of commits, back to
# back on one machine, each judged against the previous recorded run (empty commits = A/A pairs; a planted
# slowdown = a real regression that must be red after confirmation). Measures exactly committed revisions:
# the trees are cloned from a git bundle made here; the newest main's `ci` judges (`ci perf --tree`), so old
# commits are measured with today's gate, and the history lives in that clone's perf_history/.
#
#   here:   git bundle create .whl/kdengine.bundle --all        (.whl also holds asv's and ruptures' wheels)
#   device: RUNS="sha1 sha2 ..." bash ci/gpu/gate_aa.sh          (carry .whl)
#   Resolve RUNS here (git rev-parse): the device's copy of the tree may carry a stale .git, where `main`
#   named the previous commit (an A/A pair meant for an empty commit measured its parent twice).
#   or:     PLANT=perf_history/gate/gpu_accept_4617adb/planted.patch bash ci/gpu/gate_aa.sh   (the bundle's main)
#   PLANT (a `git format-patch` file, trailers included), RUNS unset: the measured clone gets an empty commit on
#   main (the A/A half, recorded) and the patch on top of it (`git am`; judged, not recorded): no branch to make here.
# Env: RUNS (commits, in order), BENCH (asv --bench regex; default verify + tree + decode suites),
#      CONFIRM (seconds of confirmation per run, default 300), FIRST_CONFIRM (for the first run, default 0),
#      CONFIRMS ("60 240": a budget per run, overriding both),
#      LIMIT (stop starting runs after this many seconds, default 540), NO_RECORD_FROM (index from which runs
#      are judged but not recorded, e.g. a planted slowdown that must not enter history).
# Output under $OUT (three files: the device tool returns at most 8): logs.tgz (every perf log), gate.tgz
# (JSON + markdown verdicts), perf_history.tgz (the new result files, to be committed here).
# Packed after every run. Watch it live: pipe its stdout through `grep --line-buffered`, never `| tail` (a
# call killed at the device's limit then prints nothing).
set -o pipefail
OUT=${OUT:-/tmp/kdengine-out}; W=/tmp/gate-work; LOG=$W/logs; rm -rf "$W"; mkdir -p "$LOG" "$W/gate" "$OUT"
SRC=$PWD; KD=/tmp/kd; TOOL=/tmp/kdtool
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache
BENCH=${BENCH:-'^bench_verify\.Verify\.|^bench_decode\.(Decode|TreeBuild)\.'}
start=$(date +%s)
pack() {
  tar czf "$OUT/logs.tgz" -C "$W" logs 2>/dev/null
  tar czf "$OUT/gate.tgz" -C "$W" gate 2>/dev/null
  [[ -d $TOOL ]] && (cd "$TOOL" && git ls-files --others --modified --exclude-standard perf_history | tar czf "$OUT/perf_history.tgz" -T -)
}
trap pack EXIT

python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$SRC"/.whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site
rm -rf "$KD" "$TOOL"
# the tool (ci/, the newest main) judges; the measured tree ($KD) is checked out at each commit in turn
git clone -q -b main "$SRC/.whl/kdengine.bundle" "$TOOL" || { echo "clone of the bundle failed"; exit 1; }
git clone -q -b main "$SRC/.whl/kdengine.bundle" "$KD" || exit 1
cd "$KD" || exit 1
git config user.name kdengine-perf; git config user.email perf@kdengine.invalid
if [[ -n ${PLANT:-} && -z ${RUNS:-} ]]; then
  git commit -q --allow-empty -m "gate check: an empty commit on main $(git rev-parse --short HEAD) [skip perf]" \
    && git am -q "$SRC/$PLANT" || { echo "PLANT: $PLANT does not apply to the bundle's main (git am)"; exit 1; }
  RUNS="$(git rev-parse HEAD~1) $(git rev-parse HEAD)"; NO_RECORD_FROM=${NO_RECORD_FROM:-1}
  echo "=== PLANT: A/A $(git rev-parse --short HEAD~1), plant $(git log -1 --format='%h %s')"
fi
git checkout -q "${RUNS%% *}" || exit 1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem --format=csv | tee "$LOG/smi.txt"
python3 -m kdengine.ops.build --arch native 2>&1 | tail -3 | tee "$LOG/build.log"

i=0; last=0; status=0
for sha in $RUNS; do
  now=$(( $(date +%s) - start ))
  if (( i > 0 && now + last > ${LIMIT:-540} )); then echo "=== skip $sha: $now s used, a run takes ~$last s"; break; fi
  git checkout -q "$sha" || { echo "no commit $sha"; status=1; break; }
  budget=${CONFIRM:-300}; (( i == 0 )) && budget=${FIRST_CONFIRM:-0}
  [[ -n ${CONFIRMS:-} ]] && budgets=($CONFIRMS) && budget=${budgets[$i]:-$budget}
  record=(); [[ -n ${NO_RECORD_FROM:-} ]] && (( i >= NO_RECORD_FROM )) && record=(--no-record)
  echo "=== run $i: $(git log -1 --format='%h %s') (confirm budget $budget s) at $now s"
  t0=$(date +%s)
  (cd "$TOOL" && exec python3 -m ci perf --tree "$KD" --bench-filter "$BENCH" --confirm-budget "$budget" "${record[@]}" \
    --json "$W/gate/run${i}_${sha:0:10}.json" --markdown "$W/gate/run${i}_${sha:0:10}.md" \
    > "$LOG/perf_run${i}_${sha:0:10}.log" 2>&1) &
  perf_pid=$!
  # a SIGTERM here (the device's time limit) goes on to `ci perf`, which then writes the rounds it completed as an
  # interrupted report (exit 143) before pack runs; the first pass is on disk from the start of the confirmation
  trap 'stopped=1; kill -TERM "$perf_pid" 2>/dev/null' TERM INT
  wait "$perf_pid"; rc=$?
  while kill -0 "$perf_pid" 2>/dev/null; do wait "$perf_pid"; rc=$?; done
  trap - TERM INT
  [[ -n ${stopped:-} ]] && { echo "=== run $i stopped (exit $rc): no further runs"; status=1; break; }
  last=$(( $(date +%s) - t0 ))
  echo "=== run $i exit $rc in $last s"
  pack  # after every run, not only on exit: a call cut at the device's limit still returns the runs it finished
  grep -E "^\[perf|verdict|regressed|noisy" "$LOG/perf_run${i}_${sha:0:10}.log" | grep -v "^  " | cut -c1-220 | tail -20
  i=$((i + 1))
done
echo "=== done in $(( $(date +%s) - start )) s"
exit $status
