"""The MLP: h -> ffn (column-parallel) -> GeLU -> ffn -> h (row-parallel).

GeLU is elementwise, so it can run on each rank's slice of the ffn dimension as it stands:
the column split of fc1 and the row split of fc2 meet with nothing to exchange in between.
(A layer that mixed the ffn dimension, a layernorm over it say, would not allow this.)
"""

from __future__ import annotations

from minitron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from minitron.core.transformer.module import MegatronModule
from minitron.trace import traced


class MLP(MegatronModule):
    def __init__(self, config):
        super().__init__(config)
        self.linear_fc1 = ColumnParallelLinear(
            config.hidden_size, config.ffn_hidden_size, config=config,
            init_method=config.init_method, bias=config.add_bias_linear,
            gather_output=False, skip_bias_add=True)
        self.activation_func = config.activation_func
        self.linear_fc2 = RowParallelLinear(
            config.ffn_hidden_size, config.hidden_size, config=config,
            init_method=config.output_layer_init_method, bias=config.add_bias_linear,
            input_is_parallel=True, skip_bias_add=True)

    @traced
    def forward(self, hidden_states):
        """[s, b, h] -> (output [s, b, h], bias): fc2's bias is left for the residual add."""
        intermediate, bias = self.linear_fc1(hidden_states)      # [s, b, ffn/p]
        if bias is not None:
            intermediate = intermediate + bias                   # Megatron fuses bias + GeLU
        intermediate = self.activation_func(intermediate)
        return self.linear_fc2(intermediate)
