"""fc1's bias and the GeLU in one kernel (Megatron's fused_bias_gelu.py, --bias-gelu-fusion).

Unfused, the MLP writes ``y + bias`` (an [s, b, ffn/p] tensor) and GeLU reads it back to write
its output; backward reads it again. Compiled, the sum stays in registers: one read of ``y``,
one write of the output, and backward recomputes the sum instead of keeping it.

Megatron's kernel computes GeLU's tanh approximation (with a hand-written backward), while its
unfused path calls the exact, erf-based F.gelu: there the flag changes the function, by up to
5e-4 per element. Here both paths compute the exact GeLU, so the flag changes speed only; the
backward is the compiler's derivative of the same few ops.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minitron.core.jit import jit_fuser


@jit_fuser
def bias_gelu(bias: torch.Tensor | None, y: torch.Tensor) -> torch.Tensor:
    return F.gelu(y if bias is None else y + bias)


def bias_gelu_impl(input: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """gelu(input + bias), the MLP's call (Megatron's name and argument order)."""
    return bias_gelu(bias, input)
