"""Split + merge calls of the dispatched sm90 kernel with the given merges, in order, on one input set (for ncu or
compute-sanitizer of the merge kernels with warm partials; written for merge2.sh, retired: ci/gpu/README.md). Checks
each result against the fp32 reference.

    python ci/gpu/merge_once.py T prefix combine [combine ...]
"""
import sys

from kdengine.bench.kernel import launcher
from kdengine.ops.inputs import make_verify_inputs, rel_l2
from kdengine.ops.mask import pack_tree_mask
from kdengine.ops.verify import verify_attention

T, prefix, combines = int(sys.argv[1]), int(sys.argv[2]), [int(c) for c in sys.argv[3:]]
inp = make_verify_inputs(B=1, T=T, H=8, prefix=prefix, page_size=64, seed=1, device="cuda")
ref = verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="reference")
bits = pack_tree_mask(inp.tree_mask)
status = 0
for c in combines:
    call, splits, result = launcher("cuda_sm90_dispatched", inp, bits, None, layout={"combine": c})
    call()
    err = rel_l2(result(), ref)
    status |= err >= 1e-2
    print(f"combine {c} T={T} prefix={prefix} nsplit={splits}: rel L2 {err:.2e}", flush=True)
sys.exit(int(status))
