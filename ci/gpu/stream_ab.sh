#!/usr/bin/env bash
# One device run for seesaw2_stream (stream-K over the SMs, csrc/verify_sm90.cuh StreamCut): its GPU tests, memcheck and
# racecheck on grids whose blocks cross row tiles, then ci/gpu/stream_ab.py (seesaw2 / stream at each cost / seesaw2
# again, interleaved, at K = 8 and K = 1 launches per replay; the decode engine with stream mode off / on / on / off).
#   here:   mkdir -p out/stream && git bundle create out/stream/kd.bundle HEAD
#   device: DEADLINE=420 bash ci/gpu/stream_ab.sh   (carry out/stream)
# ARGS: stream_ab.py's arguments (default: six sizes, costs 0-3, the engine at 65k and 16k).
NAME=stream
source ci/gpu/bundle_run.sh  # the bundle's clone (entered), step / room, the build
step "stream tests"
timeout 120 python3 -m pytest -q -m gpu tests/ops/test_sm90.py -k "stream" -p no:cacheprovider 2>&1 \
  | tee "$LOGS/pytest_stream.log" | tail -n 3
step sanitizers
cat > /tmp/stream_one.py <<'PY'
import torch
from kdengine.ops import cuda_backend
from kdengine.ops.inputs import make_verify_inputs, rel_l2
from kdengine.ops.mask import pack_tree_mask
from kdengine.ops.reference import verify_attention_reference
for T, prefix, H, B, blocks, cost in ((64, 1000, 8, 1, 3, 2), (16, 3000, 8, 2, 5, 1), (17, 700, 4, 1, 40, 0)):
    inp = make_verify_inputs(B=B, T=T, H=H, prefix=prefix, seed=1, device="cuda")
    bits = pack_tree_mask(inp.tree_mask)
    out, lse = cuda_backend.alloc_outputs(inp.q)
    slots = cuda_backend.stream_slots(blocks, -(-(T * H) // 64))
    cuda_backend.launch_sm90(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, out, lse, sm_scale=inp.sm_scale,
                             nsplit=slots, stream_blocks=blocks, stream_cost=cost)
    ref, _ = verify_attention_reference(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, sm_scale=inp.sm_scale,
                                        return_lse=True)
    print(f"T{T} p{prefix} H{H} B{B} blocks {blocks} cost {cost}: rel L2 {rel_l2(out, ref):.2e}", flush=True)
PY
for tool in memcheck racecheck; do
  room 60 && timeout 90 compute-sanitizer --tool $tool python3 /tmp/stream_one.py > "$LOGS/sanitizer_$tool.log" 2>&1
  echo "$tool: rc $? $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/sanitizer_$tool.log" | tail -1)"
  grep "rel L2" "$LOGS/sanitizer_$tool.log"
done
step "stream A/B"
room 60 && timeout $(( DEADLINE - $(now) )) python3 ci/gpu/stream_ab.py --out "$OUT/stream_ab_$sha.json" \
  ${ARGS:---sizes 65536:64 65536:16 16384:64 16384:16 4096:64 --decode 65536 16384} 2>&1 \
  | grep -v Warning | tee "$LOGS/stream_ab.log" | grep -vE "^\s*$"
step done
