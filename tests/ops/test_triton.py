"""The `triton` (split-KV) and `triton_extend` backends against the reference backend.

CPU: Triton's interpreter. Triton picks interpreter or compiler when @triton.jit runs, i.e. when
kdengine.ops.triton_verify is imported, and reads TRITON_INTERPRET from os.environ at that moment
(3.6 and 3.9 alike). Other test modules import the backends without it, and setting it here would
leak into them (the `auto` backend on CPU would become triton). So the interpreter cases run in one
child process started with TRITON_INTERPRET=1 (`python -m tests.ops.test_triton`), which checks every
case and prints one JSON record per (case, backend); each pytest case asserts on its record. When
pytest itself runs under TRITON_INTERPRET=1 the cases run in-process instead.

GPU (marked `gpu`): 4k/16k/65k contexts, T in {16, 64}, H = 8, and a CUDA-graph capture replayed at
three prefix lengths. Every output buffer (out, lse, and the split partials) starts as NaN, so each
element is proven written; a merge that read a dead split would turn NaN too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kdengine.ops.inputs import make_verify_inputs, rel_l2
from kdengine.ops.mask import pack_tree_mask

triton = pytest.importorskip("triton")

REPO = Path(__file__).resolve().parents[2]
TRITON_BACKENDS = ("triton", "triton_extend")
LSE_ATOL = 1e-3


@dataclass(frozen=True)
class Case:
    B: int  # sequences
    T: int  # tree tokens
    H: int  # heads
    prefix: tuple[int, ...]  # committed tokens per sequence
    page_size: int
    chain: bool  # chain mask instead of a random tree
    nsplit: int | None  # triton only; None = the default (auto)
    return_lse: bool = True

    @property
    def name(self) -> str:
        shape = f"B{self.B}-T{self.T}-H{self.H}-p{'_'.join(map(str, self.prefix))}-ps{self.page_size}"
        return f"{shape}-{'chain' if self.chain else 'tree'}-ns{self.nsplit}-lse{int(self.return_lse)}"


# Tiny shapes: the interpreter pays per program and per op. T=17 and H=3 give two row tiles of 32
# (triton) and two token blocks (triton_extend); page 16 puts the tree tail across pages; nsplit 40
# at <= 82 tokens leaves most splits empty; T=40 needs two mask words per row.
INTERP_CASES = [
    Case(1, 1, 1, (0,), 16, False, 1),
    Case(1, 1, 3, (130,), 64, False, 3),
    Case(3, 3, 1, (0, 63, 130), 16, False, 3),
    Case(3, 3, 3, (65, 1, 0), 64, True, 7, return_lse=False),
    Case(3, 17, 3, (1, 65, 130), 64, False, 7),
    Case(3, 17, 1, (130, 63, 0), 16, True, 1),
    Case(2, 17, 3, (63, 65), 16, False, 40),
    Case(1, 3, 3, (130,), 64, False, None),
    Case(3, 17, 3, (0, 130, 64), 16, False, 3),
    Case(2, 40, 2, (20, 70), 16, False, 3),  # two mask words per row; tiles straddle a word
    Case(1, 40, 1, (65,), 64, True, 1),
]


# ---------------------------------------------------------------------------------------------
# one case, run wherever the backends can run (interpreter child or GPU)


def poisoned_partials(module):
    """A replacement for module.alloc_partials (triton_verify) whose split partials start as NaN."""
    original = module.alloc_partials

    def alloc(*args, **kwargs):
        out_p, lse_p = original(*args, **kwargs)
        return out_p.fill_(float("nan")), lse_p.fill_(float("nan"))

    return alloc


def check_case(case: Case, backend: str, device: str = "cpu", seed: int = 0) -> dict:
    """Run `backend` on poisoned buffers and compare with the reference backend."""
    import importlib

    from kdengine.ops import reference_backend
    from kdengine.ops.verify import BACKENDS

    module = importlib.import_module(f"kdengine.ops.{BACKENDS[backend]}")
    inp = make_verify_inputs(
        B=case.B, T=case.T, H=case.H, prefix=list(case.prefix), page_size=case.page_size, chain=case.chain,
        extra_pages=1, seed=seed, device=device,
    )
    bits = pack_tree_mask(inp.tree_mask)
    out = torch.full((case.B, case.T, case.H, 512), float("nan"), dtype=torch.bfloat16, device=device)
    lse = torch.full((case.B, case.T, case.H), float("nan"), dtype=torch.float32, device=device)
    got_out, got_lse = module.run(
        inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, sm_scale=inp.sm_scale, nsplit=case.nsplit,
        return_lse=case.return_lse, out=out, lse=lse if case.return_lse else None,
    )
    ref_out, ref_lse = reference_backend.run(
        inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, sm_scale=inp.sm_scale, nsplit=None,
        return_lse=True,
    )
    record = {"out_is_buffer": got_out.data_ptr() == out.data_ptr(), "err": rel_l2(got_out, ref_out)}
    if case.return_lse:
        lse_ok = bool(torch.isfinite(got_lse).all())
        record["lse_err"] = float((got_lse - ref_lse).abs().max()) if lse_ok else float("inf")
    else:
        record["lse_none"] = got_lse is None
    return record


def check_public_api(backend: str) -> dict:
    """verify_attention(backend=...) with a bool mask; for `triton`, KDENGINE_NSPLIT reaches the kernel
    (the output equals an explicit nsplit=6 call bit for bit)."""
    from kdengine.ops import verify_attention

    inp = make_verify_inputs(B=2, T=5, H=2, prefix=[70, 9], page_size=16, seed=11)
    call = lambda **kw: verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend=backend, **kw)
    ref = verify_attention(*inp.args(), sm_scale=inp.sm_scale, backend="reference")
    record = {"err": rel_l2(call(), ref)}
    if backend == "triton":
        os.environ["KDENGINE_NSPLIT"] = "6"
        try:
            from_env = call()
        finally:
            del os.environ["KDENGINE_NSPLIT"]
        record["env_equals_arg"] = bool(torch.equal(from_env, call(nsplit=6)))
    return record


def run_cases(cases: list[Case]) -> list[dict]:
    """Every (case, backend) on the CPU with NaN partials; exceptions become records."""
    from kdengine.ops import triton_verify

    original = triton_verify.alloc_partials
    triton_verify.alloc_partials = poisoned_partials(triton_verify)
    records = []
    try:
        for case in cases:
            for backend in TRITON_BACKENDS:
                if backend == "triton_extend" and case.nsplit not in (None, 1):
                    continue  # no KV split: the nsplit variants are the same kernel
                rec = {"case": case.name, "backend": backend}
                try:
                    rec.update(check_case(case, backend))
                except Exception:  # reported by the parent test, with the traceback
                    rec["exception"] = traceback.format_exc()
                records.append(rec)
        for backend in TRITON_BACKENDS:
            rec = {"case": "api", "backend": backend}
            try:
                rec.update(check_public_api(backend))
            except Exception:
                rec["exception"] = traceback.format_exc()
            records.append(rec)
    finally:
        triton_verify.alloc_partials = original
    return records


# ---------------------------------------------------------------------------------------------
# interpreter tests (CPU)


def _interpreting_here() -> bool:
    from kdengine import env

    if not env.triton_interpret():
        return False
    from kdengine.ops import triton_extend, triton_verify

    return triton_verify.INTERPRETED and triton_extend.INTERPRETED


@pytest.fixture(scope="module")
def interp_records() -> dict:
    if _interpreting_here():
        records = run_cases(INTERP_CASES)
    else:
        env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
        env.pop("KDENGINE_NSPLIT", None)
        env.pop("KDENGINE_BACKEND", None)
        proc = subprocess.run(
            [sys.executable, "-m", "tests.ops.test_triton"], cwd=REPO, env=env, capture_output=True, text=True,
            timeout=600,
        )
        if proc.returncode != 0:
            pytest.fail(f"interpreter child failed (rc {proc.returncode}):\n{proc.stderr[-4000:]}")
        records = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {(r["case"], r["backend"]): r for r in records}


def _interp_params():
    for case in INTERP_CASES:
        for backend in TRITON_BACKENDS:
            if backend == "triton_extend" and case.nsplit not in (None, 1):
                continue
            yield pytest.param(case, backend, id=f"{backend}-{case.name}")


@pytest.mark.parametrize("case,backend", list(_interp_params()))
def test_interpreter_matches_reference(interp_records, case, backend):
    rec = interp_records.get((case.name, backend))
    assert rec is not None, f"no record for {backend} {case.name}"
    assert "exception" not in rec, rec.get("exception")
    assert rec["out_is_buffer"], "run() must write the out= buffer it was given"
    assert rec["err"] < 1e-2, rec
    if case.return_lse:
        assert rec["lse_err"] < LSE_ATOL, rec
    else:
        assert rec["lse_none"], "return_lse=False must return lse None"


@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_interpreter_public_api(interp_records, backend):
    rec = interp_records.get(("api", backend))
    assert rec is not None and "exception" not in rec, rec
    assert rec["err"] < 1e-2, rec
    if backend == "triton":
        assert rec["env_equals_arg"], "KDENGINE_NSPLIT=6 must run the same split count as nsplit=6"


def test_cpu_needs_the_interpreter(monkeypatch):
    """Without TRITON_INTERPRET=1 both backends say why they cannot run on the CPU, and auto falls
    back to the reference."""
    from kdengine.ops import triton_extend, triton_verify
    from kdengine.ops.verify import select_backend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv("KDENGINE_BACKEND", raising=False)
    cpu = torch.device("cpu")
    for module in (triton_verify, triton_extend):
        reason = module.available(cpu)
        assert reason is not None and "TRITON_INTERPRET" in reason
    assert select_backend("auto", "cpu") == "reference"
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        select_backend("triton", "cpu")


# ---------------------------------------------------------------------------------------------
# GPU tests


def _gpu_case(ctx: int, T: int, B: int = 1) -> Case:
    return Case(B, T, 8, tuple([ctx - T] * B), 64, False, None)


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
@pytest.mark.parametrize("T", [16, 64])
@pytest.mark.parametrize("ctx", [4096, 16384, 65536])
def test_gpu_matches_reference(monkeypatch, backend, ctx, T):
    from kdengine.ops import triton_verify

    monkeypatch.setattr(triton_verify, "alloc_partials", poisoned_partials(triton_verify))
    rec = check_case(_gpu_case(ctx, T), backend, device="cuda", seed=ctx + T)
    assert rec["out_is_buffer"] and rec["err"] < 1e-2 and rec["lse_err"] < LSE_ATOL, rec


@pytest.mark.gpu
@pytest.mark.parametrize(
    "case",
    [
        Case(3, 16, 8, (4000, 16368, 100), 64, False, None),
        Case(3, 64, 8, (0, 4033, 9000), 16, True, 7),
        Case(2, 17, 3, (5000, 65), 256, False, 1),
        Case(2, 64, 8, (4032, 700), 64, False, 300),  # most splits empty
        Case(1, 255, 1, (3000,), 32, False, 5),
    ],
    ids=lambda c: c.name,
)
def test_gpu_batches_and_splits(monkeypatch, case):
    from kdengine.ops import triton_verify

    monkeypatch.setattr(triton_verify, "alloc_partials", poisoned_partials(triton_verify))
    for backend in TRITON_BACKENDS:
        rec = check_case(case, backend, device="cuda", seed=case.T)
        assert rec["out_is_buffer"] and rec["err"] < 1e-2 and rec["lse_err"] < LSE_ATOL, (backend, rec)


@pytest.mark.gpu
def test_gpu_auto_picks_triton(monkeypatch):
    from kdengine.ops.verify import select_backend, unavailable_reason

    monkeypatch.delenv("KDENGINE_BACKEND", raising=False)
    if unavailable_reason("cuda", "cuda") is None:
        pytest.skip("the cuda backend is built and outranks triton")
    assert select_backend("auto", "cuda") == "triton"


@pytest.mark.gpu
@pytest.mark.parametrize("backend", TRITON_BACKENDS)
def test_gpu_cuda_graph_replays_at_new_prefix_lengths(backend):
    """One capture, replayed after writing prefix_len in place: the split schedule lives on the device."""
    from kdengine.ops import reference_backend, verify_attention

    T, capacity_prefix = 16, 16384 - 16
    inp = make_verify_inputs(B=2, T=T, H=8, prefix=capacity_prefix, page_size=64, seed=7, device="cuda")
    args = inp.args()
    call = lambda: verify_attention(*args, sm_scale=inp.sm_scale, backend=backend, return_lse=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        call()  # compile and warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = call()
    for lens in ([capacity_prefix, 3000], [5000, capacity_prefix], [1, 77]):
        inp.prefix_len.copy_(torch.tensor(lens, dtype=torch.int32))
        out.fill_(float("nan"))
        lse.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        bits = pack_tree_mask(inp.tree_mask)
        ref_out, ref_lse = reference_backend.run(
            inp.q, inp.kv_cache, inp.page_table, inp.prefix_len, bits, sm_scale=inp.sm_scale, nsplit=None,
            return_lse=True,
        )
        assert rel_l2(out, ref_out) < 1e-2, lens
        assert float((lse - ref_lse).abs().max()) < LSE_ATOL, lens


if __name__ == "__main__":  # the interpreter child: one JSON record per line
    for record in run_cases(INTERP_CASES):
        print(json.dumps(record), flush=True)
