"""The end of each residual branch: residual + dropout(x + bias) (Megatron's fused_bias_dropout.py).

The attention and the MLP hand back their last bias unadded (*skip bias add*) so that these
three steps can run as one: unfused, each reads and writes an [s, b, h] tensor (three passes,
plus dropout's mask); compiled (``--bias-dropout-fusion``), one kernel reads x, the residual and
the bias and writes the sum.

With dropout, the compiled kernel draws its mask from inductor's own random numbers (seeded
from the current generator, so the tensor-parallel streams of TransformerBlock still decide who
drops the same elements): the same distribution as F.dropout's, not the same draw. Without
dropout the two paths compute the same numbers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minitron.core.jit import jit_fuser


def bias_dropout_add(x_with_bias, residual: torch.Tensor, prob: float, training: bool) -> torch.Tensor:
    """residual + dropout(x + bias), as plain torch ops: the default path.

    The dropout draws from whichever stream is current. Without sequence parallelism that is
    the default stream, equal on every TP rank, so the replicated hidden states stay
    identical; with it, the block runs on the model-parallel stream (see TransformerBlock).
    """
    x, bias = x_with_bias
    if bias is not None:
        x = x + bias
    return residual + F.dropout(x, p=prob, training=training)


# The same function compiled. torch.compile specializes on ``training`` (and on a missing bias):
# training and evaluation get a graph each, which is why Megatron keeps two named functions.
bias_dropout_add_fused = jit_fuser(bias_dropout_add)


def get_bias_dropout_add(training: bool, fused: bool):
    """The layer's bias-dropout-add for this mode: (x_with_bias, residual, prob) -> output."""
    fn = bias_dropout_add_fused if fused else bias_dropout_add
    return lambda x_with_bias, residual, prob: fn(x_with_bias, residual, prob, training)
