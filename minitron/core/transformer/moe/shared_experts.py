"""SharedExpertMLP: an MLP every token goes through, beside the routed experts (DeepSeek's).

--moe-shared-expert-intermediate-size F adds to each MoE layer one dense MLP of inner width F
(for n shared experts of width f each, F = n x f: n MLPs that every token visits are one MLP
of the summed width). It holds what all tokens need, so the routed experts are free to
specialise. It is the dense MLP in every other respect (gated too with --swiglu, fc1's halves
cut with stride 2 over tp): split over the *tensor*-parallel group
(not the expert one), its input the layer's [s/tp, b, h] under sequence parallelism. Its
output is added to the routed experts' combined output.

Megatron runs it before the router (or, with --moe-shared-expert-overlap, while the tokens
travel: the same sum) and allows it no biases: --disable-bias-linear (validate_moe says so).
"""

from __future__ import annotations

import copy

from minitron.core.transformer.mlp import MLP


class SharedExpertMLP(MLP):
    def __init__(self, config):
        config = copy.copy(config)   # the layer's config with the shared width as the MLP's
        config.ffn_hidden_size = config.moe_shared_expert_intermediate_size
        super().__init__(config)

    def forward(self, hidden_states):
        output, bias = super().forward(hidden_states)
        assert bias is None   # no biases: --disable-bias-linear is required with shared experts
        return output
