# The common start of a one-call device run, sourced with NAME set by merged.sh, head_check.sh, pdl.sh, binding.sh, spread.sh,
# merge_ab.sh, sched_ab.sh, nsplit2.sh and peers_runs.sh (the run's folder out/$NAME, carried to the device with the
# bundle kd.bundle and any wheels): logs under $LOGS, packed into $OUT/logs.tgz at every `step` and on exit; the wheels
# installed into /tmp/site; the bundle cloned into /tmp/kd-$NAME and entered (without a bundle: the copied working tree,
# run as COMMIT, a full sha it is clean at); sha / full the commit measured; `now` seconds since the start, `room NEED`
# true while a step of NEED seconds fits before DEADLINE (s, default 420); `san` / `san_report` (compute-sanitizer);
# then the build for the local GPU.
set -o pipefail
OUT=${OUT:-/tmp/kdengine-out}; LOGS=/tmp/$NAME-logs; rm -rf "$LOGS"; mkdir -p "$OUT" "$LOGS"
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
SRC=$PWD; KD=/tmp/kd-$NAME; DEADLINE=${DEADLINE:-420}
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache TRITON_DEFAULT_FP_FUSION=1
wheels=("$SRC"/out/$NAME/*.whl)
[[ -e ${wheels[0]} ]] && { python3 -m pip install -q --no-index --no-deps --target /tmp/site "${wheels[@]}" || echo "wheels not installed"; }
if [[ -f $SRC/out/$NAME/kd.bundle ]]; then
  rm -rf "$KD" && git clone -q "$SRC/out/$NAME/kd.bundle" "$KD" && cd "$KD" || exit 1
  sha=$(git rev-parse --short HEAD); full=$(git rev-parse HEAD)
else  # no bundle (the working tree and the wheels fill the call's size limit): the copied tree, clean at COMMIT
  [[ ${COMMIT:-} =~ ^[0-9a-f]{40}$ ]] || { echo "no out/$NAME/kd.bundle: carry one, or set COMMIT to the full sha the" \
    "copied working tree is clean at (here: git status --short empty, COMMIT=\$(git rev-parse HEAD))"; exit 1; }
  KD=$SRC; full=$COMMIT; sha=${COMMIT:0:7}
fi
export PYTHONPATH=/tmp/site:$KD
echo "commit $sha"
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm --format=csv
t0=$(date +%s); now() { echo $(( $(date +%s) - t0 )); }
# each step packs the logs so far: a call cut at the device's limit still returns them (the EXIT trap may not run)
step() { tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null; echo "=== $1 ($(now) s)"; }
# room NEED: true when a step that takes up to NEED seconds fits before DEADLINE
room() { (( $(now) + $1 <= DEADLINE )) || { echo "=== skipped: $(now) s used, $1 s needed, deadline $DEADLINE s"; false; }; }
# san TOOL TAG ARGS...: compute-sanitizer TOOL on one checked call (`kdengine.bench.kernel once ARGS`) into
# /tmp/san_TAG.txt, its exit status appended (SAN_TIMEOUT s, default 60); san_report: every such file, briefly
san() {
  local tool=$1 tag=$2; shift 2
  timeout ${SAN_TIMEOUT:-60} compute-sanitizer --tool $tool --print-limit 2 --show-backtrace no --error-exitcode 9 \
    python3 -m kdengine.bench.kernel once "$@" > "/tmp/san_$tag.txt" 2>&1
  echo "$tool $* rc=$?" >> "/tmp/san_$tag.txt"
}
san_report() { for f in /tmp/san_*.txt; do grep -vE "^=========\s*$" "$f" | head -8; tail -1 "$f"; done; }
step build
timeout ${BUILD_TIMEOUT:-200} python3 -m kdengine.ops.build --arch native > "$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; exit 1; }
