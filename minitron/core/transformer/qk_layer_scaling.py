"""Megatron's --apply-query-key-layer-scaling, for core attention's unfused path.

fp16 holds values up to 65504. Deep in a network q k^T / sqrt(d) can pass that, and a score that
overflows to inf turns its softmax row into NaN. Megatron's local core attention therefore divides
the product by the layer's number (1-based, over the whole model) while it is stored in the
training dtype, casts the scores to fp32, and multiplies the number back there, before the
mask and the softmax. In exact arithmetic nothing changes; in fp16 the stored scores stay in
range, and in any dtype the rounding is that of the scaled product (what minitron reproduces).
"""

from __future__ import annotations

import torch


def uses_qk_layer_scaling(config) -> bool:
    return bool(getattr(config, "apply_query_key_layer_scaling", False))


def attention_scores(q: torch.Tensor, k: torch.Tensor, softmax_scale: float, config, layer_number: int):
    """q k^T x softmax_scale, [b, n, s, s], as Megatron's DotProductAttention computes it: in the
    training dtype, or, with query-key layer scaling, through 1/layer_number and back in fp32."""
    if not uses_qk_layer_scaling(config):
        return torch.matmul(q, k.transpose(-2, -1)) * softmax_scale
    coeff = max(1, layer_number)   # as Megatron: the first layer is number 1
    # baddbmm's alpha scales inside the kernel, before the product is rounded to the dtype: a
    # matmul then a multiply would store (and overflow) the unscaled product first.
    *lead, s, d = q.shape
    q3, k3 = q.reshape(-1, s, d), k.reshape(-1, k.size(-2), d)
    out = torch.empty(q3.size(0), s, k3.size(1), dtype=q.dtype, device=q.device)
    scores = torch.baddbmm(out, q3, k3.transpose(1, 2), beta=0.0, alpha=softmax_scale / coeff)
    return scores.view(*lead, s, k3.size(1)).float() * coeff
