"""Peers in the suite: names, skipping where the peer is absent, the ours / peer table; on an H200 with
the sgl-flash-mla wheel, FlashMLA's output against our fp32 reference with a chain mask."""

from __future__ import annotations

import pytest
import torch

from kdengine.bench import peers
from kdengine.bench import workloads as W


def test_peer_workloads_are_verify_shapes():
    w = W.find("verify-peer/flashmla/ctx65536/T64")
    assert (w.kind, w.backend, w.context, w.T, w.H, w.unit, w.direction) == ("verify", "flashmla", 65536, 64, 8,
                                                                             "seconds", "lower")


def test_absent_peer_is_a_reason_not_an_error():
    assert "unknown peer" in peers.unavailable_reason("nope")
    if not torch.cuda.is_available():
        assert peers.unavailable_reason("flashmla", "cpu") == "needs a CUDA GPU"
        assert W.unavailable_reason(W.find("verify-peer/flashmla/ctx4096/T16")) == "needs a CUDA GPU"


def test_ratio_table():
    medians = {"verify/cuda/ctx65536/T16": 130e-6, "verify/triton/ctx65536/T16": 120e-6,
               "verify-peer/flashmla/ctx65536/T16": 50e-6, "verify-peer/flashmla/ctx4096/T64": 30e-6,
               "verify/cuda/ctx4096/T64": 15e-6, "decode/cuda/ctx4096": 100.0}
    rows = peers.ratio_rows(medians)
    assert [(r["ctx"], r["T"]) for r in rows] == [(4096, 64), (65536, 16)]
    assert rows[1]["cuda"] == (130e-6, pytest.approx(2.6)) and rows[0]["triton"] is None
    lines = peers.ratio_lines(medians)
    assert lines[0].startswith("ours / peer") and "2.60x" in lines[-1] and "0.50x" in lines[-2]
    assert peers.ratio_lines({"verify/cuda/ctx4096/T16": 1e-5}) == []


@pytest.mark.gpu
@pytest.mark.parametrize("T", [16, 64])
def test_flashmla_matches_the_reference_with_a_chain_mask(T):
    reason = peers.unavailable_reason("flashmla")
    if reason is not None:
        pytest.skip(reason)
    from kdengine.bench import verify_timing
    from kdengine.ops.inputs import rel_l2
    from kdengine.ops.reference import verify_attention_reference

    inp, bits = verify_timing.make_inputs(N=4096, T=T, H=8, seed=5, device="cuda", chain=True)
    out = peers.flashmla_call(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, sm_scale=inp.sm_scale)()
    ref = verify_attention_reference(inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, sm_scale=inp.sm_scale)[0]
    assert rel_l2(out, ref) < 1e-2
