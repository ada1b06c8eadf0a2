#!/usr/bin/env bash
# One device run on one H200: does the kernel sweep's interleaved order (kdengine.bench.kernel --order
# interleaved, the default) remove the position effect of timing each variant in one block (--order sequential)?
# And do spin gaps after each sample (--gap-ms) keep the power cap off? The `seesaw2` set at 65k (staggered_small,
# seesaw2, seesaw2_bar, staggered_small again as the A/A control, FlashMLA) once per entry of RUNS (order:gap_ms),
# one process each. Each JSON comes back; the summary prints every row's median and the share of its span under
# a power or thermal cap per run (python3 ci/gpu/order_summary.py).
#   here:   mkdir -p out/order && git bundle create out/order/kd.bundle HEAD && cp .whl/sgl_flash_mla-*.whl out/order/
#   device: bash ci/gpu/order.sh   (carry out/order)
set -o pipefail
OUT=${OUT:-/tmp/kdengine-out}; LOGS=/tmp/order-logs; rm -rf "$LOGS"; mkdir -p "$OUT" "$LOGS"
trap 'tar czf "$OUT/logs.tgz" -C "$LOGS" . 2>/dev/null' EXIT
SRC=$PWD; KD=/tmp/kd-order; DEADLINE=${DEADLINE:-240}
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache
python3 -m pip install -q --no-index --no-deps --target /tmp/site "$SRC"/out/order/*.whl || echo "FlashMLA wheel not installed"
rm -rf "$KD" && git clone -q "$SRC/out/order/kd.bundle" "$KD" && cd "$KD" || exit 1
export PYTHONPATH=/tmp/site:$KD
sha=$(git rev-parse --short HEAD); full=$(git rev-parse HEAD); echo "commit $sha"
nvidia-smi --query-gpu=name,uuid,driver_version,clocks.sm,clocks.max.sm,power.limit,power.max_limit --format=csv
echo "=== build ($SECONDS s)"
timeout ${BUILD_TIMEOUT:-200} python3 -m kdengine.ops.build --arch native > "$LOGS/build.log" 2>&1 || { tail -30 "$LOGS/build.log"; exit 1; }
run=0
for spec in ${RUNS:-sequential:0 interleaved:0 sequential:0 interleaved:0}; do
  order=${spec%%:*}; gap=${spec##*:}
  run=$((run + 1)); left=$((DEADLINE - SECONDS))
  (( left > 20 )) || { echo "=== skipped run $run ($spec): $SECONDS s used"; continue; }
  echo "=== run $run: $order, gap $gap ms ($SECONDS s)"
  timeout $(( left < 70 ? left : 70 )) python3 -m kdengine.bench.kernel measure --set seesaw2 --contexts 65536 \
    --order $order --gap-ms $gap --out "$OUT/verify_kernel_order${run}_$sha.json" --commit "$full" 2>&1 | tee "$LOGS/run$run.log" \
    | grep -E "^ctx" | grep -v interleaved
done
python3 ci/gpu/order_summary.py "$OUT"/verify_kernel_order*_"$sha".json | tee "$LOGS/summary.txt"
