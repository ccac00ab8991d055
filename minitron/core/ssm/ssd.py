"""Mamba-2's state-space scan (SSD), twice: one step at a time, and a chunk at a time.

Each head h keeps a state S of shape [headdim p, state n]. At every position t it forgets a
share of the state and writes the new token into it, then reads it out through C:

    a_t = exp(dt_t * A_h)                    (A_h < 0, dt_t > 0: 0 < a_t < 1, how much survives)
    S_t = a_t * S_{t-1} + dt_t * x_t B_t^T   (x_t: [p], B_t: [n])
    y_t = S_t C_t + D_h * x_t                (C_t: [n]; D is a skip connection)

B and C are shared by the heads of a group (heads h*G/H .. of G groups), as keys and values are
shared in grouped-query attention. ``ssd_recurrence`` runs that loop as written: the reference,
but one small step per token, which a GPU cannot fill.

``ssd_chunked`` computes the same numbers in blocks of ``chunk_size`` tokens. Unrolled, y_t is a
sum over all s <= t of (C_t . B_s) * (a_{s+1} ... a_t) * dt_s x_s: attention with a causal,
decaying mask. Within a chunk that sum is done as one masked matrix product (quadratic in the
chunk length only); across chunks only the state at each chunk's end is passed on, through a
short recurrence over chunks. Big matmuls instead of L tiny steps: that is what Mamba-2's
fused kernels do (mamba_ssm's ssd_combined), and what this file does in plain torch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def _heads_view(t: torch.Tensor, nheads: int) -> torch.Tensor:
    """[b, l, g, n] -> [b, l, h, n]: each head reads its group's B (or C)."""
    return t.repeat_interleave(nheads // t.shape[2], dim=2)


def ssd_recurrence(x, dt, A, B, C, D=None, initial_state=None, return_final_state=False):
    """The scan one position at a time. x [b, l, h, p], dt [b, l, h] (after softplus),
    A [h], B and C [b, l, g, n], D [h]. Returns y [b, l, h, p] (and the last state)."""
    batch, length, nheads, headdim = x.shape
    B, C = _heads_view(B, nheads), _heads_view(C, nheads)
    state = (x.new_zeros(batch, nheads, headdim, B.shape[-1]) if initial_state is None
             else initial_state.clone())
    ys = []
    for t in range(length):
        decay = torch.exp(dt[:, t] * A)                                   # [b, h]
        write = torch.einsum("bh,bhp,bhn->bhpn", dt[:, t], x[:, t], B[:, t])
        state = decay[..., None, None] * state + write
        ys.append(torch.einsum("bhpn,bhn->bhp", state, C[:, t]))
    y = torch.stack(ys, dim=1)
    if D is not None:
        y = y + D[:, None] * x
    return (y, state) if return_final_state else y


def segsum(a: torch.Tensor) -> torch.Tensor:
    """[..., T] -> [..., T, T]: entry (i, j) is a_{j+1} + ... + a_i for j <= i, -inf above the
    diagonal, so exp() of it is the causal decay mask. Built from masked cumulative sums rather
    than as a difference of two cumsums, which would cancel catastrophically on long chunks."""
    T = a.shape[-1]
    a = a[..., None].expand(*a.shape, T)                           # [..., i, j] = a_i
    below = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device), diagonal=-1)
    sums = torch.cumsum(a.masked_fill(~below, 0), dim=-2)          # sum over j < k <= i
    keep = torch.tril(torch.ones(T, T, dtype=torch.bool, device=a.device))
    return sums.masked_fill(~keep, float("-inf"))


def ssd_chunked(x, dt, A, B, C, chunk_size: int, D=None, initial_state=None, return_final_state=False):
    """The same scan, chunk by chunk (shapes as ``ssd_recurrence``). A length that is not a
    multiple of ``chunk_size`` is padded with dt = 0 steps: exp(0) = 1 keeps the state and
    0 * x writes nothing, so the padding changes no number and is cut off again."""
    batch, length, nheads, headdim = x.shape
    chunk_size = min(chunk_size, length)   # a chunk past the end would only hold padding
    pad = (-length) % chunk_size
    if pad:
        x, B, C = (F.pad(t, (0, 0, 0, 0, 0, pad)) for t in (x, B, C))
        dt = F.pad(dt, (0, 0, 0, pad))
    B, C = _heads_view(B, nheads), _heads_view(C, nheads)
    nchunks = x.shape[1] // chunk_size

    def chunks(t):   # [b, c*q, ...] -> [b, c, q, ...]
        return t.reshape(batch, nchunks, chunk_size, *t.shape[2:])
    x, dt, B, C = chunks(x), chunks(dt), chunks(B), chunks(C)
    a = (dt * A).permute(0, 3, 1, 2)                   # [b, h, c, q]: log of each step's decay
    a_cum = torch.cumsum(a, dim=-1)                    # decay from the chunk's start to q
    xdt = x * dt[..., None]                            # what each step writes, dt_s x_s

    # 1. Inside each chunk: y_t = sum_{s<=t} (C_t . B_s) * decay(s -> t) * dt_s x_s.
    decay_in = torch.exp(segsum(a))                    # [b, h, c, q_t, q_s]
    y_in = torch.einsum("bcthn,bcshn,bhcts,bcshp->bcthp", C, B, decay_in, xdt)

    # 2. The state each chunk leaves behind on its own: its writes, decayed to its last step.
    decay_to_end = torch.exp(a_cum[..., -1:] - a_cum)  # [b, h, c, q]
    chunk_states = torch.einsum("bcshn,bhcs,bcshp->bchpn", B, decay_to_end, xdt)

    # 3. Across chunks: the state entering chunk c is the sum of earlier chunks' states, each
    #    decayed through the chunks in between (segsum over the chunk totals, plus the start).
    if initial_state is None:
        initial_state = x.new_zeros(batch, nheads, headdim, B.shape[-1])
    states = torch.cat([initial_state[:, None], chunk_states], dim=1)      # [b, c+1, h, p, n]
    chunk_decay = torch.exp(segsum(F.pad(a_cum[..., -1], (1, 0))))         # [b, h, c+1, c+1]
    states = torch.einsum("bhzc,bchpn->bzhpn", chunk_decay, states)
    entering, final_state = states[:, :-1], states[:, -1]

    # 4. What the entering state contributes at step t: read through C_t, decayed to t.
    y_carry = torch.einsum("bcthn,bchpn,bhct->bcthp", C, entering, torch.exp(a_cum))

    y = (y_in + y_carry).reshape(batch, nchunks * chunk_size, nheads, headdim)[:, :length]
    if D is not None:
        y = y + D[:, None] * x.reshape(batch, -1, nheads, headdim)[:, :length]
    return (y, final_state) if return_final_state else y
