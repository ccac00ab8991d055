"""YaRN: rope stretched to a longer context than the model was trained on (Peng et al., 2023).

Plain rope's angles m·θ_i grow with the position m. A model trained on L positions has seen
the fast channels (large θ_i) turn many times, but the slow ones (small θ_i) never complete a
turn within L: at positions past L those channels show it angles it never saw. YaRN treats the
channels by how many full turns they make over the original context, r_i = L·θ_i / 2π:

* r_i > beta_fast (32 by default): many turns; these channels carry *relative* position
  between near tokens, which is the same at any length. They keep θ_i ("extrapolation").
* r_i < beta_slow (1): not even one turn; slowed down by ``scaling_factor`` s, θ_i / s, so that
  s·L positions span the angles L positions used to ("interpolation", as
  --rotary-seq-len-interpolation-factor does for every channel).
* between the two: a linear blend of both, over the channel index.

Stretching also flattens attention (keys further away look alike), so YaRN sharpens the softmax
again: cos and sin are multiplied by a concentration factor ``mscale`` = 0.1·ln(s) + 1 (a
ratio of two such terms when ``mscale`` / ``mscale_all_dim`` are given, DeepSeek's form). It
multiplies q and k both, so the scores grow by its square. MLA folds the ``mscale_all_dim``
part into its softmax scale instead (multi_latent_attention.py).

Megatron's class keeps the interface of RotaryEmbedding but returns (angles, mscale); like
Megatron's, it rotates all ``kv_channels`` (no rotary_percent) in the (i, i + d/2) pairing,
and validate_args refuses the flags it would ignore.
"""

from __future__ import annotations

import math

import torch

from minitron.core import parallel_state
from minitron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from minitron.core.transformer.context_parallel import get_pos_emb_on_this_cp_rank


class YarnRotaryEmbedding(RotaryEmbedding):
    """Angles [s, 1, 1, kv_channels] and the concentration factor, from Megatron's parameters."""

    def __init__(self, kv_channels: int, rotary_percent: float = 1.0, rotary_interleaved: bool = False,
                 seq_len_interpolation_factor: float | None = None, rotary_base: float = 10000.0,
                 scaling_factor: float = 1.0, original_max_position_embeddings: int = 4096,
                 beta_fast: float = 32.0, beta_slow: float = 1.0, mscale: float = 1.0,
                 mscale_all_dim: float = 0.0, correction_range_round_to_int: bool = True):
        super().__init__(kv_channels, rotary_percent, rotary_interleaved, seq_len_interpolation_factor, rotary_base)
        if rotary_interleaved:
            raise ValueError("YaRN rope pairs channels (i, i + d/2), as Megatron's does: drop rotary_interleaved")
        self.dim, self.rotary_base, self.scaling_factor = kv_channels, rotary_base, scaling_factor
        self.original_max_position_embeddings = original_max_position_embeddings
        self.beta_fast, self.beta_slow = beta_fast, beta_slow
        self.mscale, self.mscale_all_dim = mscale, mscale_all_dim
        self.correction_range_round_to_int = correction_range_round_to_int
        # θ_i over all kv_channels (Megatron's self.dim), kept and slowed: the two ends of the blend.
        exponents = torch.arange(0, kv_channels, 2, dtype=torch.float32, device=self.inv_freq.device) / kv_channels
        self.inv_freq_extra = 1.0 / (rotary_base ** exponents)
        self.inv_freq_inter = 1.0 / (scaling_factor * rotary_base ** exponents)

    def yarn_inv_freq(self) -> torch.Tensor:
        """θ_i blended: the fast channels (index < low) kept, the slow ones (> high) slowed."""
        low, high = _yarn_find_correction_range(self.beta_fast, self.beta_slow, self.dim, self.rotary_base,
                                                self.original_max_position_embeddings,
                                                self.correction_range_round_to_int)
        keep = 1.0 - _yarn_linear_ramp_mask(low, high, self.dim // 2, self.inv_freq_extra.device)
        return self.inv_freq_inter * (1 - keep) + self.inv_freq_extra * keep

    def get_emb(self, max_seq_len: int, offset: int = 0):
        positions = torch.arange(max_seq_len, dtype=torch.float32, device=self.inv_freq_extra.device) + offset
        freqs = torch.outer(positions, self.yarn_inv_freq())
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]
        return emb, _yarn_get_concentration_factor(self.scaling_factor, self.mscale, self.mscale_all_dim)

    def forward(self, max_seq_len: int, offset: int = 0):
        """(angles [s, 1, 1, kv_channels] of this rank's positions, mscale for cos and sin)."""
        emb, mscale = self.get_emb(max_seq_len, offset)
        if parallel_state.is_initialized() and parallel_state.get_context_parallel_world_size() > 1:
            emb = get_pos_emb_on_this_cp_rank(emb, 0)
        return emb, mscale


def _yarn_find_correction_dim(num_rotations: float, dim: int, rotary_base: float = 10000,
                              max_position_embeddings: int = 2048) -> float:
    """The channel index i at which θ_i turns ``num_rotations`` times over the original context:
    solve L·base^(-2i/d) = 2π·r for i."""
    return dim * math.log(max_position_embeddings / (num_rotations * 2 * math.pi)) / (2 * math.log(rotary_base))


def _yarn_find_correction_range(low_rot: float, high_rot: float, dim: int, rotary_base: float = 10000,
                                max_position_embeddings: int = 2048, round_to_int: bool = True):
    """Channel indices (low, high) bounding the blend: beta_fast turns at low, beta_slow at high."""
    low = _yarn_find_correction_dim(low_rot, dim, rotary_base, max_position_embeddings)
    high = _yarn_find_correction_dim(high_rot, dim, rotary_base, max_position_embeddings)
    if round_to_int:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def _yarn_linear_ramp_mask(low: float, high: float, dim: int, device=None) -> torch.Tensor:
    """0 up to channel ``low``, 1 from ``high`` on, linear between (a zero-width ramp is widened)."""
    if low == high:
        high += 0.001
    return ((torch.arange(dim, dtype=torch.float32, device=device) - low) / (high - low)).clamp(0, 1)


def _yarn_get_mscale(scale: float = 1, mscale: float = 1) -> float:
    """YaRN's attention temperature: 0.1·mscale·ln(s) + 1, and 1 when nothing is stretched."""
    return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0


def _yarn_get_concentration_factor(scaling_factor: float, mscale: float | None, mscale_all_dim: float | None) -> float:
    """What cos and sin are multiplied by: mscale(s, mscale) / mscale(s, mscale_all_dim)."""
    if mscale is None or mscale_all_dim is None:
        return _yarn_get_mscale(scaling_factor)
    return float(_yarn_get_mscale(scaling_factor, mscale) / _yarn_get_mscale(scaling_factor, mscale_all_dim))


def _yarn_get_concentration_factor_from_config(config) -> float:
    """The factor a GPT attention layer (not MLA) multiplies cos and sin by, from config.yarn_*:
    1.0 unless yarn_rotary_scaling_factor stretches the context."""
    return _yarn_get_concentration_factor(config.yarn_rotary_scaling_factor, config.yarn_mscale,
                                          config.yarn_mscale_all_dim)
