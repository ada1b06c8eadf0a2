#!/usr/bin/env bash
# One device session for kdengine on a lent GPU machine: set up, build the CUDA kernel, GPU tests, the asv
# suite (results + samples sidecar), and the decode runs. It measures exactly a committed revision: the
# tree is cloned from a git bundle made here, so uncommitted edits never leak into recorded numbers.
#
#   here:   git bundle create .whl/kdengine.bundle HEAD main      (.whl also holds asv's wheels)
#   device: bash ci/gpu/session.sh [setup build test asv decode tp]...   (carry .whl)
# Env: R=run number for asv (1, 2 ...), BENCH=asv --bench regex, CTXS="4096 16384 65536",
#      DECODE_BACKENDS="cuda triton triton_extend", TP=2, STEPS=32.
# Output under $OUT (the device tool returns at most 8 files): logs.tgz, perf_history_run$R.tgz,
# run$R.jsonl, decode.tgz.
set -o pipefail
OUT=${OUT:-/tmp/kdengine-out}; LOG=$OUT/logs; mkdir -p "$LOG"
SRC=$PWD; KD=/tmp/kd
export PYTHONUNBUFFERED=1 KDENGINE_CACHE_DIR=/tmp/kdcache
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
STEPS_TODO=${*:-setup build test asv decode}
status=0
want() { [[ " $STEPS_TODO " == *" $1 "* ]]; }
step() { echo "=== $1 ($(date -u +%T))"; }
pack() { tar czf "$OUT/logs.tgz" -C "$OUT" logs 2>/dev/null; }
trap pack EXIT

step setup
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site "$SRC"/.whl/*.whl \
  || { echo "wheel install failed"; exit 1; }
export PYTHONPATH=/tmp/site:$KD
export ASV_PYTHONPATH=$PYTHONPATH  # asv drops PYTHONPATH for its benchmark processes, keeps this one
rm -rf "$KD"  # a warm machine may hold an older clone
git clone -q -b main "$SRC/.whl/kdengine.bundle" "$KD" || { echo "clone of the bundle failed"; exit 1; }
cd "$KD" || exit 1
SHA=$(git rev-parse HEAD); M=$(python3 -c 'from kdengine.bench.fingerprint import machine_name as m; print(m())')
echo "commit $SHA machine $M"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,clocks.mem,power.limit --format=csv | tee "$LOG/smi.txt"
python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__, 'gpus', torch.cuda.device_count())"

if want build; then
  step build
  python3 -m kdengine.ops.build --arch native 2>&1 | tail -5 | tee "$LOG/build.log" || status=1
fi

if want test; then
  step test
  timeout 300 python3 -m pytest -q -m gpu ${TESTS:-tests/ops tests/engine tests/bench} -p no:cacheprovider --durations=15 \
    --junitxml "$LOG/pytest_gpu.xml" 2>&1 | tee "$LOG/pytest_gpu.log" | tail -25 || status=1
fi

if want asv; then
  step "asv run R=${R:-1} ${BENCH:-all}"
  R=${R:-1}; PH=/tmp/ph$R
  [[ ${KEEP:-0} == 1 ]] || rm -rf "$PH"
  mkdir -p "$PH/perf_history"
  python3 - "$PH" <<'PY'
import json, os, sys
c = json.load(open("asv.conf.json"))
p = os.getcwd()
c.update(repo=p, benchmark_dir=p + "/benchmarks", results_dir=sys.argv[1] + "/perf_history", html_dir=sys.argv[1] + "/html")
json.dump(c, open("/tmp/asv.conf.json", "w"))
PY
  python3 -m asv machine --yes --machine "$M" --config /tmp/asv.conf.json > /dev/null || status=1
  start=$(date +%s)
  KDENGINE_SAMPLES_OUT=$OUT/run$R.jsonl python3 -m asv run --python=same --set-commit-hash "$SHA" --machine "$M" \
    --config /tmp/asv.conf.json --show-stderr ${BENCH:+--bench "$BENCH"} 2>&1 | tee "$LOG/asv_run$R.log" \
    | grep -E "^\[|Error|Traceback" | cut -c1-150
  echo "asv wall $(( $(date +%s) - start )) s"
  [[ -s $OUT/run$R.jsonl ]] && python3 -c "from kdengine.bench import samples as s; print(s.write_sidecar(s.collect_jsonl('$OUT/run$R.jsonl', '$SHA', '$M'), '$PH/perf_history'))"
  tar czf "$OUT/perf_history_run$R.tgz" -C "$PH" perf_history
fi

if want decode; then
  step decode
  mkdir -p "$OUT/decode"
  for b in ${DECODE_BACKENDS:-cuda triton triton_extend}; do
    for c in ${CTXS:-4096 16384 65536}; do
      timeout 240 python3 -m kdengine.cli decode --config kimi-k2-tp8-rank --layers 8 --context "$c" --budget 63 \
        --backend "$b" --steps "${STEPS:-32}" --json "$OUT/decode/decode_${b}_ctx${c}.json" 2>&1 \
        | tee "$LOG/decode_${b}_${c}.log" | tail -30 || status=1
    done
  done
  tar czf "$OUT/decode.tgz" -C "$OUT" decode && rm -rf "$OUT/decode"
fi

if want tp; then
  step "tp ${TP:-2}"
  mkdir -p "$OUT/tp"
  for c in ${CTXS:-4096 16384 65536}; do
    timeout 240 torchrun --nproc-per-node "${TP:-2}" -m kdengine.cli decode --tp "${TP:-2}" --config kimi-k2-tp8-rank \
      --layers 8 --context "$c" --budget 63 --steps "${STEPS:-32}" --json "$OUT/tp/tp${TP:-2}_ctx${c}.json" 2>&1 \
      | tee "$LOG/tp_${c}.log" | tail -40 || status=1
  done
  tar czf "$OUT/tp.tgz" -C "$OUT" tp && rm -rf "$OUT/tp"
fi

step "done status=$status"
exit $status
