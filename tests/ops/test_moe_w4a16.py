"""The W4A16 grouped MoE kernel (kdengine.ops.moe_w4a16) against dequantize-then-matmul in fp32, with
odd token counts, experts with no tokens, every token on one expert and other ranks' experts.
Rule (flash-attention's): the kernel's error is at most 2x that of the same math done by PyTorch in bf16
(+ a small floor for the interpreter's truncating bf16 casts). CPU: Triton's interpreter in a child
process (TRITON_INTERPRET must be set before triton.jit runs; see test_triton.py); GPU: in process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    N: int  # tokens
    k: int  # top-k
    E: int  # local experts
    D: int  # hidden (multiple of 32)
    I: int  # expert intermediate (multiple of 32)
    routing: str  # random | one-expert | sparse (most experts get no token) | offrank (half the ids elsewhere)
    unpack: str = "reshape"  # kernel variant: reshape | gather

    @property
    def name(self) -> str:
        return f"N{self.N}-k{self.k}-E{self.E}-D{self.D}-I{self.I}-{self.routing}-{self.unpack}"


CASES = [
    Case(7, 3, 5, 128, 64, "random"),
    Case(7, 3, 5, 128, 64, "random", "gather"),
    Case(1, 2, 4, 64, 32, "random"),
    Case(19, 2, 6, 96, 64, "one-expert"),  # 38 rows on one expert: three M blocks of 16
    Case(13, 4, 9, 64, 96, "sparse"),
    Case(11, 3, 4, 64, 64, "offrank"),
]


def make_inputs(c: Case, device: str, seed: int = 0):
    from kdengine.ops.int4 import pack_int4, quantize_int4

    gen = torch.Generator().manual_seed(seed)

    def weights(O, K):
        q, s = quantize_int4(torch.randn(c.E, O, K, generator=gen) / K**0.5)
        return pack_int4(q).to(device), s.to(device)

    w13, s13 = weights(2 * c.I, c.D)
    w2, s2 = weights(c.D, c.I)
    x = torch.randn(c.N, c.D, generator=gen).to(torch.bfloat16).to(device)
    scores = torch.rand(c.N, c.E + 3, generator=gen)
    if c.routing == "one-expert":
        scores[:, c.E - 1] += 10
    if c.routing == "sparse":
        scores[:, : c.E - 2] -= 10  # only the last two local experts (and the off-rank ones) get tokens
    ids = torch.topk(scores, c.k, dim=-1).indices
    if c.routing != "offrank":
        ids = ids.clamp(max=c.E - 1) if c.routing == "one-expert" else ids
    valid = ids < c.E
    if c.routing in ("random", "one-expert"):
        valid = torch.ones_like(valid)
        ids = ids % c.E if c.routing == "random" else ids
    route_w = torch.rand(c.N, c.k, generator=gen)
    return x, ids.to(device), valid.to(device), route_w.to(device), w13, s13, w2, s2


def torch_bf16(x, ids, valid, route_w, w13, s13, w2, s2):
    """The same math in PyTorch at the kernel's precision: bf16 weights, bf16 matmuls, bf16 h."""
    from kdengine.ops.int4 import dequantize_int4

    out = torch.zeros(x.shape[0], x.shape[1], dtype=torch.float32, device=x.device)
    for e in range(w13.shape[0]):
        rows, slot = (valid & (ids == e)).nonzero(as_tuple=True)
        if rows.numel() == 0:
            continue
        g, u = dequantize_int4(w13[e], s13[e]).chunk(2, 0)
        a = x[rows]
        h = (torch.nn.functional.silu((a @ g.t()).float()) * (a @ u.t()).float()).to(torch.bfloat16)
        y = (h @ dequantize_int4(w2[e], s2[e]).t()).float() * route_w[rows, slot].float()[:, None]
        out.index_add_(0, rows, y.to(torch.bfloat16).float())
    return out


def rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm().clamp_min(1e-12))


def check_case(c: Case, device: str) -> dict:
    from kdengine.ops.moe_w4a16 import moe_reference, moe_w4a16

    inp = make_inputs(c, device)
    got = moe_w4a16(*inp, config={"unpack": c.unpack}, poison=True)
    ref = moe_reference(*inp)
    x, ids, valid = inp[:3]
    empty = ~valid.any(-1)  # tokens with no local expert: exactly zero
    return {
        "err": rel(got, ref), "torch_err": rel(torch_bf16(*inp), ref), "finite": bool(torch.isfinite(got).all()),
        "empty_zero": bool((got[empty] == 0).all()), "shape": list(got.shape), "dtype": str(got.dtype),
    }


def check_align(device: str) -> dict:
    """align_assignments: every valid assignment exactly once, in its expert's padded block range."""
    from kdengine.ops.moe_w4a16 import BLOCK_M, align_assignments

    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 9, (23, 3), generator=gen)
    valid = ids < 7
    slots, be = align_assignments(ids.to(device), valid.to(device), 7)
    slots, be = slots.cpu(), be.cpu()
    NK = ids.numel()
    live = slots[slots < NK]
    ok_once = sorted(live.tolist()) == sorted(valid.flatten().nonzero().flatten().tolist())
    expert_of_slot = be.repeat_interleave(BLOCK_M)
    ok_expert = all(int(ids.flatten()[a]) == int(expert_of_slot[i]) for i, a in enumerate(slots.tolist()) if a < NK)
    used = int((be >= 0).sum())
    return {"once": ok_once, "expert": ok_expert, "unused_tail": bool((be[used:] == -1).all()),
            "blocks": used, "min_blocks": int(sum(-(-int(((ids == e) & valid).sum()) // BLOCK_M) for e in range(7)))}


def run_all(device: str) -> dict:
    return {"align": check_align(device), **{c.name: check_case(c, device) for c in CASES}}


def assert_results(results: dict) -> None:
    a = results["align"]
    assert a["once"] and a["expert"] and a["unused_tail"] and a["blocks"] == a["min_blocks"], a
    for c in CASES:
        r = results[c.name]
        assert r["finite"] and r["empty_zero"] and r["dtype"] == "torch.bfloat16", (c.name, r)
        assert r["err"] <= 2 * r["torch_err"] + 4e-3, (c.name, r)


def test_kernel_in_interpreter():
    if os.environ.get("TRITON_INTERPRET") == "1":
        assert_results(run_all("cpu"))
        return
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "tests.ops.test_moe_w4a16"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert_results(json.loads(proc.stdout.strip().splitlines()[-1]))


@pytest.mark.gpu
def test_kernel_on_gpu():
    assert_results(run_all("cuda"))


@pytest.mark.gpu
def test_kernel_captures_in_a_graph():
    """Replaying a captured call on new routing gives the eager result (no host sync, no stale sizes)."""
    from kdengine.ops.moe_w4a16 import moe_w4a16

    c = Case(64, 8, 48, 256, 128, "offrank")
    x, ids, valid, rw, *w = make_inputs(c, "cuda")
    static = [x.clone(), ids.clone(), valid.clone(), rw.clone()]
    moe_w4a16(*static, *w)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = moe_w4a16(*static, *w)
    x2, ids2, valid2, rw2, *_ = make_inputs(c, "cuda", seed=5)
    for s, v in zip(static, (x2, ids2, valid2, rw2), strict=True):
        s.copy_(v)
    graph.replay()
    assert torch.equal(out, moe_w4a16(x2, ids2, valid2, rw2, *w))


def test_bad_inputs_raise():
    from kdengine.ops.moe_w4a16 import moe_w4a16

    x, ids, valid, rw, w13, s13, w2, s2 = make_inputs(Case(3, 2, 4, 64, 32, "random"), "cpu")
    with pytest.raises(ValueError, match="x"):
        moe_w4a16(x.float(), ids, valid, rw, w13, s13, w2, s2)
    with pytest.raises(ValueError, match="route_w"):
        moe_w4a16(x, ids, valid, rw[:, :1], w13, s13, w2, s2)
    with pytest.raises(ValueError, match="scale"):
        moe_w4a16(x, ids, valid, rw, w13, s13[..., :1], w2, s2)
    with pytest.raises(ValueError, match="w13/w2"):
        moe_w4a16(x, ids, valid, rw, w2, s2, w13, s13)


if __name__ == "__main__":  # the interpreter child: one JSON line of results
    print(json.dumps(run_all("cpu")))
