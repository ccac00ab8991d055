"""Blockwise symmetric quantization, as DeepSpeed 0.19.8's CUDA quantizer computes it
(``ops/csrc/includes/quantization_utils.h``, ``quantize.cu``, ``swizzled_quantize.cu``,
``quant_reduce.cu``; driven from ``zero/partition_parameters.py``'s ``CUDAQuantizer`` and
``comm/coalesced_collectives.py``'s ``all_to_all_quant_reduce``).

A tensor is cut into ``groups`` equal, consecutive blocks. Each block gets one fp32 number, its
scale, and each element becomes a small integer:

    max    = the block's largest |x|, x read as fp16 (the kernel loads ``__half``)
    q      = clamp(round(x * 2^bits / (2 max)), -2^(bits-1), 2^(bits-1) - 1)
             (round half to even: ``__float2int_rn``; a block of zeros uses 1.0 for the factor)
    stored = 2 max / 2^bits      (the kernel keeps the inverse of its factor)
    x'     = q * stored, written back as fp16

So int8 keeps 127 levels each side of zero in every block and int4 keeps 7 (and -8). An element
is off by at most half a step, max / 2^bits, except the block's largest, which lands on 2^(bits-1)
and is clipped one level down: off by a whole step, 2 max / 2^bits (1/128 of max in int8, 1/8 in
int4). Int4 values travel two to a byte: the first of a
pair in the byte's upper nibble, the second in its lower (DeepSpeed's ``PackedInt4`` bit-field, as
GCC lays it out on a little-endian machine).
"""

from __future__ import annotations

import torch

from minitron.ops.quantizer.groups import weight_groups  # noqa: F401 -- qwZ's block count, re-exported

def quantize(x: torch.Tensor, groups: int, num_bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``x`` (any shape) in ``groups`` blocks -> (int8 codes, int4 codes packed two to a byte,
    fp32 scales, one per block). The kernel reads fp16: a wider tensor is rounded to it first."""
    blocks = x.detach().reshape(groups, -1).to(torch.half).float()
    top = blocks.abs().amax(dim=1, keepdim=True)
    factor = torch.where(top == 0, torch.ones_like(top), (1 << num_bits) / (2 * top))
    low, high = -(1 << (num_bits - 1)), (1 << (num_bits - 1)) - 1
    codes = torch.round(blocks * factor).clamp(low, high).to(torch.int8).reshape(-1)
    scales = (1 / factor).reshape(-1)
    return (pack_int4(codes) if num_bits == 4 else codes), scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor, num_bits: int) -> torch.Tensor:
    """Codes and their blocks' scales -> fp16 values, one flat tensor (the kernel's output dtype)."""
    values = unpack_int4(codes) if num_bits == 4 else codes
    blocks = values.reshape(scales.numel(), -1).float() * scales.reshape(-1, 1)
    return blocks.to(torch.half).reshape(-1)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """Values in [-8, 7], pairs into bytes: element 2k in the upper nibble, 2k + 1 in the lower."""
    pairs = codes.reshape(-1, 2).to(torch.int16) & 0xF
    return ((pairs[:, 0] << 4) | pairs[:, 1]).to(torch.uint8).view(torch.int8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """The inverse of pack_int4: each nibble sign-extended back to an int8."""
    raw = packed.view(torch.uint8).to(torch.int16)
    pairs = torch.stack([raw >> 4, raw & 0xF], dim=1)
    return torch.where(pairs > 7, pairs - 16, pairs).to(torch.int8).reshape(-1)
