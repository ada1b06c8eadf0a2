# The common start of a one-call device run from a git bundle, sourced by merged.sh, pdl.sh, binding.sh, spread.sh and
# merge_ab.sh with NAME
# set (the run's folder out/$NAME, carried to the device with the bundle kd.bundle and any wheels): logs under $LOGS, packed
# into $OUT/logs.tgz at every `step` and on exit; the wheels installed into /tmp/site; the bundle cloned into
# /tmp/kd-$NAME and entered; sha / full the commit measured; `now` seconds since the start, `room NEED` true while a
# step of NEED seconds fits before DEADLINE (s, default 420); then the build for the local GPU.
set -o pipefail
OUT=${OUT:-/tmp/kdengine-out}; LOGS=/tmp/$NAME-logs; rm -rf "$LOGS"; mkdir -p "$OUT" "$LOGS"
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
SRC=$PWD; KD=/tmp/kd-$NAME; DEADLINE=${DEADLINE:-420}
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache TRITON_DEFAULT_FP_FUSION=1
wheels=("$SRC"/out/$NAME/*.whl)
[[ -e ${wheels[0]} ]] && { python3 -m pip install -q --no-index --no-deps --target /tmp/site "${wheels[@]}" || echo "wheels not installed"; }
rm -rf "$KD" && git clone -q "$SRC/out/$NAME/kd.bundle" "$KD" && cd "$KD" || exit 1
export PYTHONPATH=/tmp/site:$KD
sha=$(git rev-parse --short HEAD); full=$(git rev-parse HEAD); echo "commit $sha"
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm --format=csv
t0=$(date +%s); now() { echo $(( $(date +%s) - t0 )); }
# each step packs the logs so far: a call cut at the device's limit still returns them (the EXIT trap may not run)
step() { tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null; echo "=== $1 ($(now) s)"; }
# room NEED: true when a step that takes up to NEED seconds fits before DEADLINE
room() { (( $(now) + $1 <= DEADLINE )) || { echo "=== skipped: $(now) s used, $1 s needed, deadline $DEADLINE s"; false; }; }
step build
timeout ${BUILD_TIMEOUT:-200} python3 -m kdengine.ops.build --arch native > "$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; exit 1; }
