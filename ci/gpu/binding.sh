#!/usr/bin/env bash
# One short device run of the binding's failing checks: build, ci/gpu/binding_errors.py (every case, one process
# each), the GPU test that runs the numeric ones, ci/gpu/torch_check_probe.py with torch's default flags (a TORCH_CHECK
# formatting a number by stream insertion against by std::to_string). Logs under $OUT.
#   here:   rm -rf out/bind && mkdir -p out/bind && git bundle create out/bind/kd.bundle HEAD
#   device: bash ci/gpu/binding.sh   (carry out/bind)
set -o pipefail
OUT=${OUT:-/tmp/kdengine-out}; mkdir -p "$OUT"
SRC=$PWD; KD=/tmp/kd-bind
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache
rm -rf "$KD" && git clone -q "$SRC/out/bind/kd.bundle" "$KD" 2> /dev/null && cd "$KD" || exit 1
export PYTHONPATH=$KD
echo "commit $(git rev-parse --short HEAD)"
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
g++ --version | head -1
echo "=== build"; timeout 200 python3 -m kdengine.ops.build --arch native > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
echo "=== binding errors"; timeout 120 python3 ci/gpu/binding_errors.py 2>&1 | tee "$OUT/binding_errors.log"
echo "=== GPU test"; timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_cuda.py \
  -k "format_a_number or fp32_partials" 2>&1 | tail -3 | tee "$OUT/pytest.log"
echo "=== minimal extension"; KD_PROBE_FLAGS=torch KD_PROBE_EXT=0 timeout 150 python3 ci/gpu/torch_check_probe.py 2>&1 \
  | tee "$OUT/torch_check_probe.log"
