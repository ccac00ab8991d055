"""fp8 scaling recipes: how a tensor becomes 8-bit floats and how its scale is chosen.

An fp8 number has few bits: e4m3 (4 exponent bits, 3 mantissa bits) reaches +-448, e5m2
(5 and 2) reaches +-57344 with one bit less precision. A tensor's values rarely sit in that
range, so each tensor is multiplied by a *scale* first, chosen so that its largest magnitude
(its *amax*) lands near the format's maximum: q = fp8(x * scale), x ~ q * (1 / scale). Values
beyond the maximum saturate to it (Transformer Engine casts "satfinite"), never to inf or NaN.

Three of Transformer Engine's recipes, as Megatron selects them with ``--fp8-recipe``:

* ``delayed`` (TE's DelayedScaling): the scale used now comes from amaxes already seen. Each
  tensor slot keeps the amaxes of its last ``amax_history_len`` steps; after each cast the
  slot's amax is reduced (max) over the amax reduction group, entered into the history, and the
  next scale is fp8_max / amax / 2^margin, amax being the history's max (``max``) or its newest
  entry (``most_recent``). An amax of zero or a non-finite one keeps the previous scale. The
  first step uses scale 1. TE keeps the history as a buffer it rolls in place; the window of
  values, which is all the scale reads, is the same as the newest-first list kept here.
* ``tensorwise`` (TE's Float8CurrentScaling): the scale is fp8_max / amax of the tensor being
  cast, right now (1 if its amax is zero or not finite); no history. Its amax is reduced over a
  group only where TE reduces it: a sequence-parallel input, so its gathered pieces share one
  scale (the caller passes that group).

* ``mxfp8`` (TE's MXFP8BlockScaling): no tensor-wide scale; every 32 consecutive elements along
  the dimension a GEMM sums over share a power-of-two scale (``mx_quantize``).

A *step* here is one use of the slot: one micro-batch's forward for an input or a weight, one
backward for a gradient. Megatron enters TE's fp8 context once per micro-batch forward, and TE
updates delayed scales when that context closes and when the backward ends, so the two agree.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minitron.core.jit import jit_fuser

# format name -> (torch dtype, largest finite magnitude)
FORMATS = {
    "e4m3": (torch.float8_e4m3fn, 448.0),
    "e5m2": (torch.float8_e5m2, 57344.0),
}


def formats_for(fp8_format: str) -> dict[str, str]:
    """Which format each role gets: ``hybrid`` gives gradients e5m2's range (gradients span
    more orders of magnitude than activations and weights, and need precision less)."""
    if fp8_format not in ("e4m3", "hybrid"):
        raise ValueError(f"fp8 format must be e4m3 or hybrid, got {fp8_format!r}")
    grad = "e5m2" if fp8_format == "hybrid" else "e4m3"
    return {"input": "e4m3", "weight": "e4m3", "grad_output": grad}


def _cast(x: torch.Tensor, scale: torch.Tensor, fp8_max: float, dtype: torch.dtype) -> torch.Tensor:
    return (x.float() * scale).clamp(-fp8_max, fp8_max).to(dtype)


# On a GPU the four passes above (widen, scale, clamp, narrow) each cross memory: measured on an
# H200, that made fp8 training 0.57x bf16's speed. Compiled, they are one kernel, as TE's fused
# cast is; the arithmetic is the same fp32 product and clamp (check_fp8_gpu.py holds the two
# bit for bit). On the CPU the plain ops run: compiling there costs seconds and buys nothing.
_cast_fused = jit_fuser(_cast)


def quantize(x: torch.Tensor, scale: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp8(x * scale), saturating at the format's maximum; the product is taken in fp32."""
    dtype, fp8_max = FORMATS[fmt]
    return (_cast_fused if x.is_cuda else _cast)(x, scale, fp8_max, dtype)


def dequantize(q: torch.Tensor, scale_inv: torch.Tensor) -> torch.Tensor:
    """Back to fp32: q * (1 / scale), the factor TE keeps beside each fp8 tensor; for MXFP8 the
    e8m0 exponents of q's blocks, along the one dimension where the two shapes differ."""
    if scale_inv.dtype == torch.uint8:
        dim = next(d for d in range(q.dim()) if q.shape[d] != scale_inv.shape[d])
        factor = torch.ldexp(torch.ones_like(scale_inv, dtype=torch.float32), scale_inv.int() - 127)
        scale_inv = factor.repeat_interleave(MX_BLOCK, dim)
    return q.float() * scale_inv


# --- MXFP8 (--fp8-recipe mxfp8) ---------------------------------------------------------------
MX_BLOCK = 32


def mx_quantize(x: torch.Tensor, fmt: str, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 tensor, e8m0 exponents): every 32 consecutive elements along ``dim`` share a
    power-of-two scale, kept as one byte, its exponent + 127. The scale is the smallest power
    of two that brings the block's amax within the format, 2^ceil(log2(amax * (1 / fp8_max))),
    the product in fp32 as TE's cast takes it before rounding the exponent up: nothing
    saturates. A block of zeros gets 2^-127 (TE's byte 0)."""
    fp8_max = FORMATS[fmt][1]
    along = x.float().movedim(dim, -1)   # the block count spelt out: an expert may have no rows
    blocks = along.unflatten(-1, (along.size(-1) // MX_BLOCK, MX_BLOCK))
    amax = blocks.abs().amax(-1)
    mantissa, exp = torch.frexp(amax * (1.0 / fp8_max))  # = mantissa * 2^exp, mantissa in [0.5, 1)
    exp = torch.where(mantissa == 0.5, exp - 1, exp)     # an exact power of two is not rounded up
    exp = torch.where(amax > 0, exp, torch.full_like(exp, -127)).clamp(-127, 127)
    scaled = blocks * torch.ldexp(torch.ones_like(amax), -exp).unsqueeze(-1)
    q = scaled.clamp(-fp8_max, fp8_max).to(FORMATS[fmt][0]).flatten(-2).movedim(-1, dim)
    return q, (exp + 127).to(torch.uint8).movedim(-1, dim)


def delayed_scale(history: torch.Tensor, scale: torch.Tensor, fmt: str, margin: int,
                  algo: str) -> torch.Tensor:
    """The next scale from a newest-first amax history (TE's default scaling-factor rule)."""
    amax = history.max() if algo == "max" else history[0]
    new = FORMATS[fmt][1] / amax / 2.0 ** margin
    keep = ~torch.isfinite(amax) | (amax <= 0)
    return torch.where(keep, scale, new)


def current_scale(amax: torch.Tensor, fmt: str) -> torch.Tensor:
    """fp8_max / amax; 1 where amax is zero or not finite (TE's current-scaling rule)."""
    fp8_max = FORMATS[fmt][1]
    ok = torch.isfinite(amax) & (amax > 0)
    scale = torch.where(ok, fp8_max / torch.where(ok, amax, torch.ones_like(amax)), torch.ones_like(amax))
    # a tiny amax can overflow fp8_max / amax; TE then takes fp32's largest value
    return torch.nan_to_num(scale, posinf=torch.finfo(torch.float32).max)


def _amax(x: torch.Tensor) -> torch.Tensor:
    return x.detach().abs().amax().float() if x.numel() else torch.zeros((), dtype=torch.float32, device=x.device)


class DelayedScaling:
    """One tensor slot's state under the delayed recipe: the amax history and the scale the
    next cast will use. A cast uses the scale already there, then reduces its own amax over
    ``group`` and enters it, so the scale is ready for the next step: TE does the same at the
    end of the step, for all slots in one all-reduce; here each slot sends its own 4 bytes."""

    def __init__(self, fmt: str, history_len: int, algo: str, margin: int, group=None):
        self.fmt, self.algo, self.margin, self.group = fmt, algo, margin, group
        # newest first; both move to the amax's device at the first record (a slot is made
        # before it has seen a tensor, so it does not know the device yet)
        self.history = torch.zeros(history_len, dtype=torch.float32)   # host: until the first record
        self.scale = torch.ones((), dtype=torch.float32)               # host: the next cast's, ditto

    def record(self, amax: torch.Tensor, reduced: bool = False) -> None:
        """Close a step: reduce its amax (unless the caller has: fp8 params, param_gather.py),
        enter it in the history, choose the next scale."""
        if not reduced and self.group is not None and dist.get_world_size(self.group) > 1:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=self.group)
        # kept on the amax's device: no host synchronisation per step
        self.history = torch.cat([amax.reshape(1), self.history[:-1].to(amax.device)])
        self.scale = delayed_scale(self.history, self.scale.to(amax.device), self.fmt, self.margin, self.algo)

    def quantize(self, x: torch.Tensor, group=None) -> tuple[torch.Tensor, torch.Tensor]:
        """(fp8 tensor, 1 / the scale it was cast with); the amax it had goes to the history.
        ``group`` is not read: the amax reduction group already spans the tensor-parallel ranks."""
        scale = self.scale.to(x.device)
        q = quantize(x, scale, self.fmt)
        self.record(_amax(x))
        return q, scale.reciprocal()


class MXScaling:
    """One tensor slot under the mxfp8 recipe: no state; each cast blocks along the dimension
    the GEMM sums over, so a tensor that enters two GEMMs is cast twice (``cast_for``)."""

    def __init__(self, fmt: str):
        self.fmt = fmt

    def quantize(self, x: torch.Tensor, group=None, dim: int = -1) -> tuple[torch.Tensor, torch.Tensor]:
        return mx_quantize(x, self.fmt, dim)


class CurrentScaling:
    """One tensor slot under the tensorwise recipe: each cast takes its tensor's own amax now."""

    def __init__(self, fmt: str):
        self.fmt = fmt
        self.scale = torch.ones((), dtype=torch.float32)   # host: the last one used (for reading), replaced by it

    def quantize(self, x: torch.Tensor, group=None) -> tuple[torch.Tensor, torch.Tensor]:
        amax = _amax(x)
        if group is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(amax, op=dist.ReduceOp.MAX, group=group)
        scale = self.scale = current_scale(amax, self.fmt)
        return quantize(x, scale, self.fmt), scale.reciprocal()
