"""The reference backend against an independent float64 dense attention, over odd sizes."""

from __future__ import annotations

import pytest
import torch

from kdengine.ops import verify_attention
from kdengine.ops.inputs import make_verify_inputs, rel_l2
from tests.ops.dense import dense_verify_f64

CASES = [
    # (B, T, H, prefix, chain)
    (1, 1, 1, 0, False),
    (1, 3, 8, 1, False),
    (1, 16, 8, 63, False),
    (1, 17, 16, 64, True),
    (1, 64, 8, 65, False),
    (1, 255, 1, 1000, False),
    (3, 16, 8, [0, 65, 1000], False),
    (3, 17, 1, [64, 1, 63], True),
]


@pytest.mark.parametrize("B,T,H,prefix,chain", CASES)
@pytest.mark.parametrize("page_size", [16, 64])
def test_reference_matches_float64_dense(B, T, H, prefix, chain, page_size):
    inp = make_verify_inputs(B=B, T=T, H=H, prefix=prefix, page_size=page_size, chain=chain, seed=B * 1000 + T)
    out, lse = verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="reference", return_lse=True)
    ref_out, ref_lse = dense_verify_f64(*inp.args(), inp.sm_scale)
    assert out.shape == (B, T, H, 512) and out.dtype == torch.bfloat16
    assert lse.shape == (B, T, H) and lse.dtype == torch.float32
    assert rel_l2(out, ref_out) < 1e-2  # bf16 rounding of the output
    assert torch.allclose(lse.double(), ref_lse, atol=1e-4, rtol=1e-5)


def test_reference_mask_changes_result():
    """A tree token must not see its siblings: the chain and tree masks give different outputs."""
    inp = make_verify_inputs(T=8, H=2, prefix=5, seed=3)
    tree_out = verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="reference")
    full = torch.ones_like(inp.tree_mask).tril()
    chain_out = verify_attention(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, full, sm_scale=inp.sm_scale, backend="reference")
    differs = (tree_out.float() - chain_out.float()).abs().amax(dim=(-1, -2))[0]  # [T]
    same_rows = (inp.tree_mask[0] == full[0]).all(-1)
    assert torch.equal(differs == 0, same_rows)
