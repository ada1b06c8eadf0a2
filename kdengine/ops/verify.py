"""verify_attention: MLA tree-verify attention over a paged latent KV cache.

All T tree tokens of each sequence attend to its whole committed prefix and, through the ancestor
mask, to their ancestors in the draft tree. MLA has one latent KV head, so every (tree token, head)
query row of a sequence shares each KV tile; the split-KV backends exploit that.

    q          [B, T, H, 576] bf16   absorbed query (512 latent + 64 rope)
    kv_cache   [P, page_size, 576]   one layer's latent KV pool; V = the first 512 dims of a row
    page_table [B, max_pages] int32  page ids of each sequence, in token order
    prefix_len [B] int32 (device)    committed tokens; tree tokens sit at prefix_len .. prefix_len+T-1
    tree_mask  [B, T, T] bool or packed int32 [B, T, ceil(T/32)] (see kdengine.ops.mask)
    ->  out [B, T, H, 512] bf16  (and lse [B, T, H] fp32, natural log, when return_lse=True)
"""

from __future__ import annotations

import importlib
from types import ModuleType

import torch

from kdengine import env
from kdengine.ops.schedule import check_nsplit
from kdengine.ops.validate import check_inputs

# Backend name -> module (under kdengine.ops) exposing available(device) -> str | None (the reason
# it cannot run, or None) and run(q, kv_cache, page_table, prefix_len, mask_bits, *, sm_scale,
# nsplit, return_lse) -> (out, lse | None).
BACKENDS = {
    "reference": "reference_backend",
    "triton": "triton_verify",
    "triton_extend": "triton_extend",
    "cuda": "cuda_backend",
}
AUTO_ORDER = ("cuda", "triton", "reference")


def _module(name: str) -> ModuleType:
    return importlib.import_module(f"kdengine.ops.{BACKENDS[name]}")


def unavailable_reason(backend: str, device: torch.device | str) -> str | None:
    """None when `backend` can run on `device`, else a one-line reason."""
    if backend not in BACKENDS:
        return f"unknown backend {backend!r} (known: {', '.join(BACKENDS)})"
    try:
        return _module(backend).available(torch.device(device))
    except ImportError as exc:  # a backend whose dependency is missing
        return f"{backend}: import failed ({exc})"


def available_backends(device: torch.device | str) -> list[str]:
    return [name for name in BACKENDS if unavailable_reason(name, device) is None]


def select_backend(backend: str, device: torch.device | str) -> str:
    """Resolve `auto` (cuda > triton > reference by availability); check an explicit name runs here."""
    if not isinstance(backend, str):
        raise ValueError(f"backend: expected one of {['auto', *BACKENDS]}, got {backend!r}")
    if backend == "auto":
        pinned = env.backend_override()
        if pinned is not None:
            return select_backend(pinned, device)
        for name in AUTO_ORDER:
            if unavailable_reason(name, device) is None:
                return name
        return "reference"
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {['auto', *BACKENDS]}, got {backend!r}")
    reason = unavailable_reason(backend, device)
    if reason is not None:
        raise RuntimeError(f"backend {backend!r} cannot run on {device}: {reason}")
    return backend


def verify_attention(
    q: torch.Tensor,
    kv_cache: torch.Tensor,
    page_table: torch.Tensor,
    prefix_len: torch.Tensor,
    tree_mask: torch.Tensor,
    *,
    sm_scale: float,
    nsplit: int | str | None = None,
    backend: str = "auto",
    return_lse: bool = False,
    check_mask: bool = False,
    check_values: bool = True,
):
    """Tree-verify attention; see the module docstring for shapes. Returns out, or (out, lse).

    check_values=False skips the checks that read device values (prefix_len against the pages, page ids,
    the mask diagonal: host syncs) for a caller that already checked these very buffers, e.g. the
    engine's layers 1.. after layer 0 of the same step. Shape, dtype and device checks always run."""
    check_nsplit(nsplit)
    bits = check_inputs(q, kv_cache, page_table, prefix_len, tree_mask, sm_scale=sm_scale, check_mask=check_mask,
                        check_values=check_values)
    name = select_backend(backend, q.device)
    out, lse = _module(name).run(
        q, kv_cache, page_table, prefix_len, bits, sm_scale=float(sm_scale), nsplit=nsplit, return_lse=return_lse
    )
    return (out, lse) if return_lse else out
