"""placeholder: the triton_extend backend is being written."""

from __future__ import annotations

import torch


def available(device: torch.device) -> str | None:
    return "triton_extend is not implemented yet"


def run(q, kv_cache, page_table, prefix_len, mask_bits, *, sm_scale, nsplit, return_lse):
    raise RuntimeError(available(q.device))
