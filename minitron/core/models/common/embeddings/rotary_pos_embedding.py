"""Rotary position embedding (RoPE): position enters attention as a rotation of q and k.

Instead of adding a learned vector to each token's input, RoPE turns pairs of channels of
every query and key by an angle proportional to the token's position m:

    (x_i, x_{i+d/2})  ->  (x_i cos mθ_i - x_{i+d/2} sin mθ_i,  x_{i+d/2} cos mθ_i + x_i sin mθ_i)
    θ_i = base^(-2i/d),  i = 0 .. d/2 - 1

A rotation by mθ dotted with a rotation by nθ is a rotation by (m - n)θ, so the score
q_m · k_n depends on the two positions only through their distance. There is no parameter:
the angles are a function of (position, channel), computed once per forward.

Where it sits in a parallel model:
* tensor parallelism splits heads, and every head is rotated alike, so each rank rotates its
  own heads with the same angles: nothing to exchange;
* sequence parallelism: the rotation is applied after linear_qkv, whose all-gather has already
  rebuilt the whole sequence, so the angles are those of the full length;
* context parallelism: a rank holds chunks i and 2cp-1-i of the sequence, so it takes the
  angles of exactly those positions (``get_pos_emb_on_this_cp_rank``).

Megatron's knobs, all of which only change the table of angles:
* ``rotary_percent`` < 1 rotates only the first part of each head's channels (GPT-NeoX does
  25%) and passes the rest through unchanged;
* ``rotary_interleaved`` pairs channel 2i with 2i+1 (RoFormer, GPT-J) instead of i with i+d/2
  (GPT-NeoX, LLaMA): the same rotations on another pairing, so a checkpoint trained one way
  gives other logits the other way;
* ``seq_len_interpolation_factor`` F divides every position by F ("position interpolation"):
  a model trained on s tokens sees s·F tokens through the angles it knows;
* ``rope_scaling`` (Llama 3.1): slows the slow angles down by ``rope_scaling_factor`` and
  leaves the fast ones alone (``_apply_scaling``).
"""

from __future__ import annotations

import math

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state
from minitron.core.transformer.context_parallel import get_pos_emb_on_this_cp_rank

# Llama 3.1's constants, which Megatron's _apply_scaling takes as its defaults (only the
# factor has a flag, --rope-scaling-factor): angles whose wavelength is longer than the
# original context / LOW_FREQ_FACTOR are divided by the factor, those shorter than
# original context / HIGH_FREQ_FACTOR are kept, and the ones between are blended.
LOW_FREQ_FACTOR, HIGH_FREQ_FACTOR, ORIGINAL_MAX_POSITION_EMBEDDINGS = 1, 4, 8192


class RotaryEmbedding(torch.nn.Module):
    """The angles m·θ_i for positions m < seq_len, shaped [s, 1, 1, rot_dim] to broadcast over [s, b, n, d]."""

    def __init__(self, kv_channels: int, rotary_percent: float = 1.0, rotary_interleaved: bool = False,
                 seq_len_interpolation_factor: float | None = None, rotary_base: float = 10000,
                 rope_scaling: bool = False, rope_scaling_factor: float = 8.0):
        super().__init__()
        dim = kv_channels if rotary_percent >= 1.0 else int(kv_channels * rotary_percent)
        if dim < 2 or dim % 2:
            raise ValueError(f"rotary dimension {dim} (kv_channels {kv_channels} x rotary_percent "
                             f"{rotary_percent}) must be an even number >= 2: channels rotate in pairs")
        self.rotary_interleaved = rotary_interleaved
        self.seq_len_interpolation_factor = seq_len_interpolation_factor
        # θ_i = base^(-2i/dim): fast rotations in the first channels, slow ones in the last.
        # A plain fp32 attribute, as in Megatron, not a buffer: Float16Module casts every
        # floating buffer, and in bf16 the angles m·θ count positions exactly only up to 256
        # (4096 positions fall on 769 values). Nor is it saved. Not being a buffer, it does not
        # follow module.to(device) either, so it is made where this rank computes: the model
        # is built after the device is set, and then moving it leaves this in place.
        device = get_accelerator().current_device_name()
        inv_freq = 1.0 / (rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float32, device=device) / dim))
        self.inv_freq = self._apply_scaling(inv_freq, rope_scaling_factor) if rope_scaling else inv_freq

    @staticmethod
    def _apply_scaling(inv_freq: torch.Tensor, factor: float) -> torch.Tensor:
        """Llama 3.1's rope scaling: a long context without new angles for the short range.

        An angle's wavelength 2π/θ is how many positions one full turn takes. Turns shorter than
        ORIGINAL/HIGH (2048 positions) tell neighbouring tokens apart and stay as trained; turns
        longer than ORIGINAL/LOW (8192, the whole original context) never completed a turn in
        training, so they are slowed by ``factor`` to cover a context ``factor`` times longer.
        In between, the angle slides linearly (in 1/wavelength) from slowed to kept.
        """
        wavelength = 2 * math.pi / inv_freq
        low_wavelength = ORIGINAL_MAX_POSITION_EMBEDDINGS / LOW_FREQ_FACTOR
        high_wavelength = ORIGINAL_MAX_POSITION_EMBEDDINGS / HIGH_FREQ_FACTOR
        scaled = torch.where(wavelength > low_wavelength, inv_freq / factor, inv_freq)
        # smooth: 0 at the long end of the band (fully slowed), 1 at the short end (kept).
        smooth = (ORIGINAL_MAX_POSITION_EMBEDDINGS / wavelength - LOW_FREQ_FACTOR) / (HIGH_FREQ_FACTOR - LOW_FREQ_FACTOR)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        in_band = (wavelength >= high_wavelength) & (wavelength <= low_wavelength)
        return torch.where(in_band, blended, scaled)

    def forward(self, max_seq_len: int) -> torch.Tensor:
        """The angles in fp32, whatever the model's dtype: apply_rotary_pos_emb casts their cos and sin."""
        positions = torch.arange(max_seq_len, dtype=torch.float32, device=self.inv_freq.device)
        if self.seq_len_interpolation_factor is not None:
            positions = positions / self.seq_len_interpolation_factor
        freqs = torch.outer(positions, self.inv_freq)               # [s, dim/2]: m·θ_i
        if self.rotary_interleaved:
            # Channels 2i and 2i+1 form a pair: each angle appears twice, side by side.
            emb = freqs.repeat_interleave(2, dim=-1)
        else:
            # Channel i and channel i + dim/2 form a pair and turn by the same angle.
            emb = torch.cat((freqs, freqs), dim=-1)
        emb = emb[:, None, None, :]                                 # [s, 1, 1, dim]
        # Outside a run (no groups built) there is no context parallelism to cut for, as
        # Megatron's get_context_parallel_group(check_initialized=False) has it.
        if parallel_state.is_initialized() and parallel_state.get_context_parallel_world_size() > 1:
            emb = get_pos_emb_on_this_cp_rank(emb, 0)
        return emb


def _rotate_half(x: torch.Tensor, rotary_interleaved: bool = False) -> torch.Tensor:
    """The 90° turn of every channel pair: (x1, x2) -> (-x2, x1), pairs (i, i + d/2) or (2i, 2i+1)."""
    if not rotary_interleaved:
        x1, x2 = torch.chunk(x, 2, dim=-1)
        return torch.cat((-x2, x1), dim=-1)
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((-x2, x1), dim=-1).flatten(-2)


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor, rotary_interleaved: bool = False,
                         mscale: float = 1.0) -> torch.Tensor:
    """Rotate t [s, b, n, d] by the angles freqs [s, 1, 1, rot_dim]; channels past rot_dim pass through.
    ``mscale``: YaRN's concentration factor, a scale on cos and sin (1.0 for plain rope)."""
    rot_dim = freqs.shape[-1]
    t_rot, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    # cos and sin of the fp32 angles, then cast: a value in [-1, 1] loses only bf16's 3 digits,
    # where an angle of thousands of radians cast to bf16 first would lose whole turns.
    cos, sin = (freqs.cos() * mscale).to(t.dtype), (freqs.sin() * mscale).to(t.dtype)
    t_rot = t_rot * cos + _rotate_half(t_rot, rotary_interleaved) * sin
    return torch.cat((t_rot, t_pass), dim=-1)
