"""The position options' defining properties, one process, no model run longer than a few ms.

Megatron-Core's own numbers are held in tests/test_mcore_attention.py (marked mcore); these
say what each knob means, so that a reader sees it and a regression shows in the default run.
"""

from __future__ import annotations

import math

import torch

from distributed import run_ranks
from minitron.core.models.common.embeddings.rotary_pos_embedding import (
    HIGH_FREQ_FACTOR, LOW_FREQ_FACTOR, ORIGINAL_MAX_POSITION_EMBEDDINGS, RotaryEmbedding, apply_rotary_pos_emb)
from minitron.core.models.gpt import GPTModel
from minitron.core.transformer import TransformerConfig


def test_interleaved_pairs_are_the_half_pairs_with_channels_reordered():
    # Interleaved rope turns (2i, 2i+1) where the default turns (i, i + d/2): the same rotation
    # after moving channel 2i to i and 2i+1 to i + d/2.
    d, s = 8, 5
    x = torch.randn(s, 1, 2, d, generator=torch.Generator().manual_seed(0))
    order = torch.cat([torch.arange(0, d, 2), torch.arange(1, d, 2)])
    interleaved = apply_rotary_pos_emb(x, RotaryEmbedding(d, rotary_interleaved=True)(s), rotary_interleaved=True)
    half = apply_rotary_pos_emb(x[..., order], RotaryEmbedding(d)(s))
    torch.testing.assert_close(interleaved[..., order], half)


def test_interpolation_factor_divides_the_positions():
    plain, stretched = RotaryEmbedding(16)(32), RotaryEmbedding(16, seq_len_interpolation_factor=4)(32)
    torch.testing.assert_close(stretched[::4], plain[:8])


def test_llama31_scaling_keeps_fast_angles_and_slows_slow_ones():
    plain, scaled = RotaryEmbedding(128, rotary_base=500000), RotaryEmbedding(128, rotary_base=500000,
                                                                               rope_scaling=True, rope_scaling_factor=8)
    wavelength = 2 * math.pi / plain.inv_freq
    fast = wavelength < ORIGINAL_MAX_POSITION_EMBEDDINGS / HIGH_FREQ_FACTOR
    slow = wavelength > ORIGINAL_MAX_POSITION_EMBEDDINGS / LOW_FREQ_FACTOR
    band = ~fast & ~slow
    assert fast.any() and slow.any() and band.any()       # base 500000 reaches all three
    assert torch.equal(scaled.inv_freq[fast], plain.inv_freq[fast])
    torch.testing.assert_close(scaled.inv_freq[slow], plain.inv_freq[slow] / 8)
    ratio = scaled.inv_freq[band] / plain.inv_freq[band]  # between slowed and kept, never outside
    assert ((ratio > 1 / 8) & (ratio < 1)).all()


def _no_positions(rank: int):
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, hidden_dropout=0.0,
                               attention_dropout=0.0, init_seed=1)
    model = GPTModel(config, 32, 8, position_embedding_type="none").eval()
    assert not [name for name, _ in model.named_parameters() if "position" in name]
    ids = torch.tensor([[1, 2, 3, 4]])
    logits = model(ids, torch.arange(4)[None])
    swapped = model(ids[:, [1, 0, 2, 3]], torch.arange(4)[None])
    # Causality alone orders the tokens: the last position sees the same set, hence the same
    # logits; the first sees another token, hence other logits.
    torch.testing.assert_close(logits[0, 3], swapped[0, 3])
    assert not torch.allclose(logits[0, 0], swapped[0, 0])


def test_no_position_embedding_has_no_position_parameter_and_still_sees_order():
    run_ranks(_no_positions, world_size=1)
