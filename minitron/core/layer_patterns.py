"""Which layers are which: Megatron's layer-frequency patterns, read the same way everywhere.

``--moe-layer-freq`` says which layers' MLP is a mixture of experts: an int N means layers
0, N, 2N, ... (counted from 0), a list gives each layer's choice (1 = MoE), as in DeepSeek's
``([0]+[1]*26)``, whose first layer stays dense. The model, the accountant and the FLOP count
all ask this one function, so they cannot disagree about a layer. Imports nothing: the
estimator, which must stay torch-free, reads it too.
"""

from __future__ import annotations


def moe_layer_pattern(moe_layer_freq, num_layers: int) -> list[int]:
    """1 for each layer (0-based) whose MLP is an MoE layer, 0 for a dense one."""
    if isinstance(moe_layer_freq, int):
        return [1 if i % moe_layer_freq == 0 else 0 for i in range(num_layers)]
    return [int(bool(v)) for v in moe_layer_freq]
