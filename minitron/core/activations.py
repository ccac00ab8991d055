"""The MLP activations Megatron-Core adds to torch's (megatron/core/activations.py).

* ``squared_relu`` (--squared-relu, Primer; Nemotron's MLP): relu(x)^2. Zero for x < 0 like
  relu, but smooth at 0 and growing quadratically, which Primer found trains faster than GeLU.
* ``quick_gelu`` (--quick-geglu: gpt-oss's gated unit, whose gate it is): x·sigmoid(1.702 x), a
  one-sigmoid approximation of GeLU (CLIP's). gpt-oss computes the gate with alpha 1.702 too.

Both are elementwise, so each tensor-parallel rank applies them to its own columns of fc1's
output, as it does GeLU (mlp.py).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def squared_relu(x: torch.Tensor) -> torch.Tensor:
    return torch.pow(F.relu(x), 2)


def quick_gelu(x: torch.Tensor) -> torch.Tensor:
    return x * torch.sigmoid(1.702 * x)
