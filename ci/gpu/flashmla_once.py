"""A few FlashMLA calls on our verify inputs, B=1, H=8 (for ncu: ci/gpu/merged.sh, probes):
python ci/gpu/flashmla_once.py T prefix."""
import sys

import torch

from kdengine.bench import peers
from kdengine.ops.inputs import make_verify_inputs

T, prefix = int(sys.argv[1]), int(sys.argv[2])
inp = make_verify_inputs(B=1, T=T, H=8, prefix=prefix, seed=1, device="cuda")
call = peers.flashmla_call(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, sm_scale=inp.sm_scale)
for _ in range(3):
    out = call()
torch.cuda.synchronize()
print("flashmla once", tuple(out.shape), float(out.float().abs().mean()))
