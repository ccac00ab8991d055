"""Sliding-window attention: which layers use it, and the mask that makes the window.

Megatron-Core keeps both helpers in megatron/core/transformer/utils.py, under these names.
A window of (left, right) lets query i see keys i - left .. i + right. A GPT trains with
(left, 0): the causal mask, cut off ``left`` tokens back. Layers alternate between windowed
and full attention by ``window_attn_skip_freq`` (gpt-oss: every other layer is full), so the
model keeps some layers that see the whole context while most pay for a band of it only.
"""

from __future__ import annotations

import torch


def is_layer_window_attention(window_size, window_attn_skip_freq, layer_number: int) -> bool:
    """Does layer ``layer_number`` (1-based, as Megatron numbers layers) use the window?

    ``window_attn_skip_freq`` N: every N-th layer (N, 2N, ...) attends to everything, the rest
    through the window; a list gives each layer's choice (1 = window); None: every layer."""
    if not window_size:
        return False
    if window_attn_skip_freq is None:
        return True
    if isinstance(window_attn_skip_freq, int):
        return layer_number % window_attn_skip_freq != 0
    return bool(window_attn_skip_freq[layer_number - 1])


def get_sliding_window_causal_mask(sq: int, skv: int, window_size, device=None) -> torch.Tensor:
    """[sq, skv] boolean mask, True = hidden, for a window of (left, right) tokens around each
    query (the last query aligned with the last key). -1 on a side means no limit that side."""
    left, right = window_size
    visible = torch.ones(sq, skv, dtype=torch.bool, device=device)
    if left >= 0:
        visible = visible.triu(skv - sq - left)
    if right >= 0:
        visible = visible.tril(skv - sq + right)
    return ~visible
