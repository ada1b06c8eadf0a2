"""Input checks for verify_attention. Every failure is a ValueError that names the argument and
gives the expected and the actual value. Checks that need device values run on eager calls only
and are skipped while a CUDA graph is being captured (replays rely on the engine, which validated
those buffers when it filled them).
"""

from __future__ import annotations

import math

import torch

from kdengine.ops.mask import is_ancestor_closed, mask_words, pack_tree_mask, unpack_tree_mask
from kdengine.ops.shapes import D_QK, D_ROPE, DV

MAX_T = 256
PAGE_SIZES = tuple(2**k for k in range(4, 9))  # 16 .. 256


def _fail(name: str, expected: str, actual) -> None:
    raise ValueError(f"{name}: expected {expected}, got {actual}")


def check_scale(sm_scale) -> None:
    """sm_scale: a finite float > 0 (the cuda launchers check it too: the sm90 kernel's seesaw2 takes the row max
    of unscaled scores and scales it after, right for a positive scale only)."""
    if not isinstance(sm_scale, (int, float)) or isinstance(sm_scale, bool) or not math.isfinite(sm_scale) or sm_scale <= 0:
        _fail("sm_scale", "a finite float > 0", sm_scale)


def _check_tensor(name: str, t, dtype: torch.dtype, rank: int) -> None:
    if not isinstance(t, torch.Tensor):
        _fail(name, "a torch.Tensor", type(t).__name__)
    if t.dtype != dtype:
        _fail(name, f"dtype {dtype}", t.dtype)
    if t.dim() != rank:
        _fail(name, f"a rank-{rank} tensor", f"shape {list(t.shape)}")
    if not t.is_contiguous():
        _fail(name, "a contiguous tensor", f"strides {t.stride()} for shape {list(t.shape)}")


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def check_inputs(q, kv_cache, page_table, prefix_len, tree_mask, *, sm_scale, check_mask: bool,
                 check_values: bool = True):
    """Validate every argument; return the packed int32 mask [B, T, W] the kernels read. The checks of
    device values (host syncs) run when check_values is set and no CUDA graph is being captured."""
    _check_tensor("q", q, torch.bfloat16, 4)
    B, T, H, D = q.shape
    if D != D_QK:
        _fail("q", f"last dim {D_QK} ({DV} latent + {D_ROPE} rope)", D)
    if not 1 <= T <= MAX_T:
        _fail("q", f"T (dim 1) in [1, {MAX_T}]", T)
    if B < 1 or H < 1:
        _fail("q", "B >= 1 and H >= 1", f"shape {list(q.shape)}")
    _check_tensor("kv_cache", kv_cache, torch.bfloat16, 3)
    num_pages, page_size, Dk = kv_cache.shape
    if Dk != D_QK:
        _fail("kv_cache", f"last dim {D_QK}", Dk)
    if page_size not in PAGE_SIZES:
        _fail("kv_cache", f"page_size (dim 1) a power of two in {PAGE_SIZES}", page_size)
    if num_pages < 1:
        _fail("kv_cache", "at least one page", num_pages)
    _check_tensor("page_table", page_table, torch.int32, 2)
    if page_table.shape[0] != B:
        _fail("page_table", f"{B} rows (batch of q)", page_table.shape[0])
    _check_tensor("prefix_len", prefix_len, torch.int32, 1)
    if prefix_len.shape[0] != B:
        _fail("prefix_len", f"shape [{B}]", list(prefix_len.shape))
    for name, t in (("kv_cache", kv_cache), ("page_table", page_table), ("prefix_len", prefix_len)):
        if t.device != q.device:
            _fail(name, f"device {q.device} (the device of q)", t.device)
    check_scale(sm_scale)
    bits = _mask_bits(tree_mask, B, T, q.device)
    if check_values and not capturing():
        _check_device_values(q, kv_cache, page_table, prefix_len, tree_mask, bits, check_mask)
    return bits


def _mask_bits(tree_mask, B: int, T: int, device) -> torch.Tensor:
    if not isinstance(tree_mask, torch.Tensor):
        _fail("tree_mask", "a torch.Tensor", type(tree_mask).__name__)
    if tree_mask.device != device:
        _fail("tree_mask", f"device {device} (the device of q)", tree_mask.device)
    if tree_mask.dtype == torch.bool:
        if list(tree_mask.shape) != [B, T, T]:
            _fail("tree_mask", f"bool shape [{B}, {T}, {T}]", list(tree_mask.shape))
        return pack_tree_mask(tree_mask)
    if tree_mask.dtype == torch.int32:
        W = mask_words(T)
        if list(tree_mask.shape) != [B, T, W]:
            _fail("tree_mask", f"packed int32 shape [{B}, {T}, {W}]", list(tree_mask.shape))
        if not tree_mask.is_contiguous():
            _fail("tree_mask", "a contiguous tensor", f"strides {tree_mask.stride()}")
        return tree_mask
    _fail("tree_mask", "dtype torch.bool [B, T, T] or packed torch.int32 [B, T, ceil(T/32)]", tree_mask.dtype)


def _check_device_values(q, kv_cache, page_table, prefix_len, tree_mask, bits, check_mask: bool) -> None:
    B, T = q.shape[:2]
    num_pages, page_size, _ = kv_cache.shape
    max_pages = page_table.shape[1]
    lens = prefix_len.to(torch.int64)
    if bool((lens < 0).any()):
        _fail("prefix_len", "values >= 0", prefix_len.tolist())
    capacity = max_pages * page_size
    total = lens + T
    if bool((total > capacity).any()):
        b = int(torch.argmax(total))
        _fail(
            "prefix_len",
            f"prefix_len + T <= max_pages * page_size = {max_pages} * {page_size} = {capacity} "
            f"(the pages in page_table)",
            f"prefix_len[{b}] + T = {int(lens[b])} + {T} = {int(total[b])}",
        )
    # Only the pages a sequence actually uses must be valid ids; the rest of the row may hold padding.
    used = (torch.arange(max_pages, device=q.device)[None, :] * page_size) < total[:, None]
    bad = used & ((page_table < 0) | (page_table >= num_pages))
    if bool(bad.any()):
        b, p = (int(x) for x in bad.nonzero()[0])
        _fail("page_table", f"page ids in [0, {num_pages}) for used pages", f"page_table[{b}, {p}] = {int(page_table[b, p])}")
    dense = unpack_tree_mask(bits, T) if tree_mask.dtype != torch.bool else tree_mask
    no_diag = ~dense.diagonal(dim1=1, dim2=2)
    if bool(no_diag.any()):
        b, i = (int(x) for x in no_diag.nonzero()[0])
        _fail("tree_mask", "the diagonal set (every tree token sees itself)", f"tree_mask[{b}, {i}, {i}] = False")
    if check_mask:
        ok = is_ancestor_closed(dense)
        if not bool(ok.all()):
            b = int((~ok).nonzero()[0, 0])
            _fail("tree_mask", "an ancestor-closed tree mask (check_mask=True)", f"batch element {b} is not")
