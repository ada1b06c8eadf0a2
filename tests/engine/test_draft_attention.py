"""The drafter's split-KV context attention equals torch SDPA with the drafter's length mask: in the
Triton interpreter (child process, CPU) and compiled (GPU); bad inputs raise ValueError naming the argument."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

CASES = [  # (B, Hd, L, S, dh, lengths, nsplit): several splits, empty splits, a zero context, L < 16, odd S
    (2, 3, 16, 300, 32, [100, 250], None), (1, 2, 5, 131, 16, [0], 3), (2, 2, 16, 200, 64, [184, 7], 4),
    (3, 1, 16, 1000, 16, [999, 1, 500], 7),
]


def errors(device: str) -> list[float]:
    """max |kernel - SDPA(fp32)| per case minus 2x the error of SDPA in bf16 (<= 0 passes)."""
    from kdengine.engine.draft_attention import draft_attention

    gen = torch.Generator().manual_seed(1234)
    out = []
    for B, HD, L, S, DH, lens, ns in CASES:
        q, k, v = (torch.randn(B, HD, n, DH, generator=gen).bfloat16() for n in (L, S, S))
        ln = torch.tensor(lens, dtype=torch.int32)
        got = draft_attention(q.to(device), k.to(device), v.to(device), ln.to(device), ns).float().cpu()
        mask = (torch.arange(S)[None, :] < (ln[:, None] + L))[:, None, None, :]
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
        torch_bf16 = F.scaled_dot_product_attention(q, k, v, attn_mask=mask).float()
        out.append(float((got - ref).abs().max() - max(2 * (torch_bf16 - ref).abs().max(), 1e-2)))
    return out


def test_split_kv_equals_sdpa_in_the_interpreter():
    env = {**os.environ, "TRITON_INTERPRET": "1", "CUDA_VISIBLE_DEVICES": ""}
    code = "from tests.engine.test_draft_attention import errors; print('EXCESS', max(errors('cpu')))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[2], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    excess = float(proc.stdout.split("EXCESS")[1])
    assert excess <= 0, proc.stdout


def test_bad_inputs_raise():
    from kdengine.engine.draft_attention import draft_attention

    q, k = torch.zeros(1, 2, 16, 32, dtype=torch.bfloat16), torch.zeros(1, 2, 64, 32, dtype=torch.bfloat16)
    lens = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="q/k/v"):
        draft_attention(q, k[:, :1], k[:, :1], lens)
    with pytest.raises(ValueError, match="k/v"):
        draft_attention(q, k.float(), k, lens)
    with pytest.raises(ValueError, match="lengths"):
        draft_attention(q, k, k, lens.long())
    with pytest.raises(ValueError, match="head dim"):
        draft_attention(q[..., :24], k[..., :24], k[..., :24], lens)


def test_cpu_outside_the_interpreter_keeps_sdpa():
    from kdengine.engine.draft_attention import INTERPRETED, unavailable_reason

    q = torch.zeros(1, 1, 4, 16, dtype=torch.bfloat16)
    assert (unavailable_reason(q) is None) == INTERPRETED
    assert unavailable_reason(q.float()) is not None  # fp32/fp64 drafters (CPU tests) stay on SDPA


@pytest.mark.gpu
def test_split_kv_equals_sdpa_on_the_gpu():
    assert max(errors("cuda")) <= 0
