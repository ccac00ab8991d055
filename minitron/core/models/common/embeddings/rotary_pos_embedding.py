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

``rotary_percent`` < 1 rotates only the first part of each head's channels (GPT-NeoX does 25%)
and passes the rest through unchanged.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state


def get_pos_emb_on_this_cp_rank(pos_emb: torch.Tensor, seq_dim: int = 0) -> torch.Tensor:
    """The angles of this context-parallel rank's two chunks, i and 2cp-1-i, in that order."""
    cp_size = parallel_state.get_context_parallel_world_size()
    cp_rank = parallel_state.get_context_parallel_rank()
    chunks = pos_emb.chunk(2 * cp_size, dim=seq_dim)
    return torch.cat([chunks[cp_rank], chunks[2 * cp_size - 1 - cp_rank]], dim=seq_dim)


class RotaryEmbedding(torch.nn.Module):
    """The angles m·θ_i for positions m < seq_len, shaped [s, 1, 1, rot_dim] to broadcast over [s, b, n, d]."""

    def __init__(self, kv_channels: int, rotary_percent: float = 1.0, rotary_base: float = 10000):
        super().__init__()
        dim = kv_channels if rotary_percent >= 1.0 else int(kv_channels * rotary_percent)
        if dim < 2 or dim % 2:
            raise ValueError(f"rotary dimension {dim} (kv_channels {kv_channels} x rotary_percent "
                             f"{rotary_percent}) must be an even number >= 2: channels rotate in pairs")
        # θ_i = base^(-2i/dim): fast rotations in the first channels, slow ones in the last.
        inv_freq = 1.0 / (rotary_base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
        self.register_buffer("inv_freq", inv_freq, persistent=False)  # not a parameter, not saved

    def forward(self, max_seq_len: int) -> torch.Tensor:
        positions = torch.arange(max_seq_len, dtype=self.inv_freq.dtype, device=self.inv_freq.device)
        freqs = torch.outer(positions, self.inv_freq)               # [s, dim/2]: m·θ_i
        # Channel i and channel i + dim/2 form a pair and turn by the same angle.
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, None, :]   # [s, 1, 1, dim]
        if parallel_state.get_context_parallel_world_size() > 1:
            emb = get_pos_emb_on_this_cp_rank(emb, 0)
        return emb


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) -> (-x2, x1): the 90° turn of every channel pair (i, i + d/2)."""
    x1, x2 = torch.chunk(x, 2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rotary_pos_emb(t: torch.Tensor, freqs: torch.Tensor) -> torch.Tensor:
    """Rotate t [s, b, n, d] by the angles freqs [s, 1, 1, rot_dim]; channels past rot_dim pass through."""
    rot_dim = freqs.shape[-1]
    t_rot, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    cos, sin = freqs.cos().to(t.dtype), freqs.sin().to(t.dtype)
    t_rot = t_rot * cos + _rotate_half(t_rot) * sin
    return torch.cat((t_rot, t_pass), dim=-1)
