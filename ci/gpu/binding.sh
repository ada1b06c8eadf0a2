#!/usr/bin/env bash
# One short device run of the binding's failing checks: build, ci/gpu/binding_errors.py (every case, one process
# each), the GPU test that runs the numeric ones, ci/gpu/torch_check_probe.py with torch's default flags (a TORCH_CHECK
# formatting a number by stream insertion against by std::to_string). Logs in $OUT/logs.tgz.
#   here:   rm -rf out/bind && mkdir -p out/bind && git bundle create out/bind/kd.bundle HEAD
#   device: bash ci/gpu/binding.sh   (carry out/bind)
NAME=bind
source ci/gpu/bundle_run.sh  # the bundle's clone (entered), step / room, the build
python3 -c "import torch, sys; print('torch', torch.__version__, 'python', sys.version.split()[0])"
g++ --version | head -1
step "binding errors"
timeout 120 python3 ci/gpu/binding_errors.py 2>&1 | tee "$LOGS/binding_errors.log"
step "GPU test"
timeout 120 python3 -m pytest -q -p no:cacheprovider -m gpu tests/ops/test_cuda.py -k "format_a_number or fp32_partials" \
  2>&1 | tail -3 | tee "$LOGS/pytest.log"
step "minimal extension"
KD_PROBE_FLAGS=torch KD_PROBE_EXT=0 timeout 150 python3 ci/gpu/torch_check_probe.py 2>&1 | tee "$LOGS/torch_check_probe.log"
step done
