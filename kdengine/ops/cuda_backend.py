"""Backend adapter for the CUDA C++ verify kernel in csrc/ (JIT-built on first use)."""

from __future__ import annotations

import torch


def available(device: torch.device) -> str | None:
    return "the cuda backend is not built yet (csrc/ kernel pending); use backend='triton' or 'reference'"


def run(q, kv_cache, page_table, prefix_len, mask_bits, *, sm_scale, nsplit, return_lse):
    raise RuntimeError(available(q.device))
