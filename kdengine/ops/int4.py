"""INT4 weights in the compressed-tensors "pack-quantized" format (symmetric, per-group scales), as Kimi
K2-Thinking / K2.5 / K2.6 ship their routed experts: per linear W [out, in]
  weight_packed  int32 [out, in/8]    eight 4-bit values per word along `in`, value j of a word in bits 4j..4j+3
                                      (low nibble first), each stored as q + 8 (q in [-8, 7])
  weight_scale   bf16  [out, in/G]    one scale per group of G = 32 consecutive inputs
  weight_shape   int64 [2]            [out, in] before packing
  W[o, i] = q[o, i] * scale[o, i // G]  (no zero point: symmetric).

Sources (read with the project's search tool, paraphrased, not copied):
- vllm-project/compressed-tensors, src/compressed_tensors/compressors/quantized_compressors/pack_quantized.py:
  pack_to_int32 adds offset 1 << (num_bits - 1) (= 8), views the row as [rows, cols/8, 8] and sums
  value << (4 * index) into an int32 (packed_dim 1 = along the input dim); unpack_from_int32 takes
  (word >> 4i) & 0xF for column i::8 and subtracts 8; compress_module stores weight_shape as
  torch.tensor(weight.shape) (int64).
- vllm-project/vllm, .../compressed_tensors/schemes/compressed_tensors_wNa16.py: weight_packed int32
  [out, in/8] (packed_dim 1, pack_factor 8), weight_shape int64 [2], weight_scale [out, in/group] in the
  model's params dtype (bf16 for Kimi).
- The Kimi K2-Thinking / K2.6 config.json quantization_config (quoted in public loaders): quant_method
  "compressed-tensors", format "pack-quantized", one config group with weights {num_bits 4, type "int",
  symmetric true, strategy "group", group_size 32, dynamic false, actorder null}, input_activations null;
  ignore = self_attn, shared_experts, the dense mlp projections and lm_head (only routed experts are INT4).

Letters: O output rows, K input columns, G group size (32).
"""

from __future__ import annotations

import torch

BITS = 4
PACK = 32 // BITS  # values per int32 word
OFFSET = 1 << (BITS - 1)  # stored nibble = q + 8
QMIN, QMAX = -OFFSET, OFFSET - 1
GROUP = 32  # Kimi's group size; other group sizes that divide K work everywhere below


def check_packed(packed: torch.Tensor, scale: torch.Tensor, group: int = GROUP) -> tuple[int, int]:
    """(O, K) of a packed weight [..., O, K/8] int32 with scales [..., O, K/G]; ValueError otherwise."""
    if packed.dtype != torch.int32:
        raise ValueError(f"packed: expected dtype torch.int32, got {packed.dtype}")
    O, K = packed.shape[-2], packed.shape[-1] * PACK
    if group < PACK or group % PACK or K % group:
        raise ValueError(f"group: expected a multiple of {PACK} dividing K={K}, got {group}")
    want = (*packed.shape[:-1], K // group)
    if tuple(scale.shape) != want:
        raise ValueError(f"scale: expected shape {list(want)} for packed {list(packed.shape)}, group {group}; got {list(scale.shape)}")
    return O, K


def pack_int4(q: torch.Tensor) -> torch.Tensor:
    """q [..., O, K] integers in [-8, 7] -> int32 [..., O, K/8] (compressed-tensors pack_to_int32)."""
    if q.shape[-1] % PACK:
        raise ValueError(f"q: expected the last dim a multiple of {PACK}, got {q.shape[-1]}")
    if q.numel() and (int(q.min()) < QMIN or int(q.max()) > QMAX):
        raise ValueError(f"q: expected values in [{QMIN}, {QMAX}], got [{int(q.min())}, {int(q.max())}]")
    u = (q.to(torch.int64) + OFFSET).reshape(*q.shape[:-1], q.shape[-1] // PACK, PACK)
    shifts = torch.arange(PACK, device=q.device, dtype=torch.int64) * BITS
    words = (u << shifts).sum(-1)  # [0, 2^32): reinterpret the top bit as the int32 sign
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """int32 [..., O, K/8] -> int8 [..., O, K] in [-8, 7] (compressed-tensors unpack_from_int32)."""
    if packed.dtype != torch.int32:
        raise ValueError(f"packed: expected dtype torch.int32, got {packed.dtype}")
    shifts = torch.arange(PACK, device=packed.device, dtype=torch.int32) * BITS
    nib = (packed[..., None] >> shifts) & 0xF  # arithmetic shift, then the mask keeps 4 bits
    return (nib - OFFSET).to(torch.int8).reshape(*packed.shape[:-1], packed.shape[-1] * PACK)


def quantize_int4(w: torch.Tensor, group: int = GROUP, scale_dtype=torch.bfloat16):
    """Symmetric group quantization W [..., O, K] -> (q int8 [..., O, K], scale [..., O, K/G]):
    scale = max|W| / 7 over the group (rounded to scale_dtype first), q = clamp(round(W / scale), -8, 7).
    Max error per element: scale / 2."""
    K = w.shape[-1]
    if K % group:
        raise ValueError(f"w: expected the last dim a multiple of group={group}, got {K}")
    g = w.float().reshape(*w.shape[:-1], K // group, group)
    scale = (g.abs().amax(-1) / QMAX).clamp_min(1e-12).to(scale_dtype)
    q = torch.round(g / scale.float()[..., None]).clamp(QMIN, QMAX)
    return q.reshape(w.shape).to(torch.int8), scale


def dequantize_int4(packed: torch.Tensor, scale: torch.Tensor, dtype=torch.bfloat16, group: int = GROUP) -> torch.Tensor:
    """The reference dequantization: q * scale in fp32 (fp64 when asked), then cast to `dtype`. [..., O, K]."""
    check_packed(packed, scale, group)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    q = unpack_int4(packed).to(acc)
    s = scale.to(acc).repeat_interleave(group, dim=-1)
    return (q * s).to(dtype)
