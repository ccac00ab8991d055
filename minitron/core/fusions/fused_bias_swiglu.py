"""fc1's bias and the SwiGLU in one kernel (Megatron's fused_bias_swiglu.py, --bias-swiglu-fusion).

fc1 makes [gate | up] (mlp.py explains how each rank holds matching halves). Unfused, three
ops follow fc1 (add the bias, SiLU the gate, multiply by up), each a pass that reads its input
from memory and writes its result back. Compiled, one kernel reads fc1's output once and writes
the product; backward recomputes the SiLU from fc1's output instead of keeping it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minitron.core.jit import jit_fuser


@jit_fuser
def bias_swiglu(y: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    if bias is not None:
        y = y + bias
    gate, up = torch.chunk(y, 2, dim=-1)
    return F.silu(gate) * up


def bias_swiglu_impl(input: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """silu(gate + bias_gate) * (up + bias_up), the MLP's call (Megatron's name)."""
    return bias_swiglu(input, bias)
