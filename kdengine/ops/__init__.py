"""Verify attention and its backends: reference (torch), triton (split-KV), triton_extend (the seed's
no-split baseline), cuda (csrc/)."""

from kdengine.ops.mask import chain_mask, mask_from_parents, pack_tree_mask, unpack_tree_mask
from kdengine.ops.verify import BACKENDS, available_backends, select_backend, verify_attention

__all__ = [
    "BACKENDS",
    "available_backends",
    "chain_mask",
    "mask_from_parents",
    "pack_tree_mask",
    "select_backend",
    "unpack_tree_mask",
    "verify_attention",
]
