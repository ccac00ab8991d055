"""One transformer layer's parameters on tensor-parallel rank 0, as the accountant counts them.

    python docs/examples/layer_params.py WORLD [Megatron flags...]

validates the flags as `minitron` does for a world of WORLD ranks, then prints each parameter
of layer 0 that a rank holds, with its element count: the list training/theoretical_params.py
builds from the arguments alone, which tests/test_estimate.py holds against what the ranks
really hold. No rank is started.
"""

from __future__ import annotations

import sys

from minitron.cli.common import validate_pretrain
from minitron.training.theoretical_params import layer_params

if __name__ == "__main__":
    args = validate_pretrain(sys.argv[2:], int(sys.argv[1]))
    for param in layer_params(args, 0):
        print(f"{param.numel:6}  {param.name}")
