"""One checked call of each named sm90 schedule on the same inputs, in one process (for ncu: one tool start for
several kernels; each call is its own launch of verify_sm90_kernel, in the order given).

    python ci/gpu/sm90_once_many.py T prefix schedule [schedule ...]
"""
import sys

from kdengine.bench.kernel import launcher
from kdengine.ops.inputs import make_verify_inputs, rel_l2
from kdengine.ops.mask import pack_tree_mask
from kdengine.ops.verify import verify_attention

T, prefix, names = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3:]
inp = make_verify_inputs(B=1, T=T, H=8, prefix=prefix, page_size=64, seed=1, device="cuda")
ref = verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="reference")
bits = pack_tree_mask(inp.tree_mask)
status = 0
for name in names:
    call, splits, result = launcher(f"cuda_sm90_{name}", inp, bits, None, layout={"combine": None})
    call()
    err = rel_l2(result(), ref)
    status |= err >= 1e-2
    print(f"{name} T={T} prefix={prefix} nsplit={splits}: rel L2 {err:.2e}", flush=True)
sys.exit(int(status))
