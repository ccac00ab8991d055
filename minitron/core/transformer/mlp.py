"""The MLP: h -> ffn (column-parallel) -> activation -> ffn -> h (row-parallel).

GeLU is elementwise, so it can run on each rank's slice of the ffn dimension as it stands:
the column split of fc1 and the row split of fc2 meet with nothing to exchange in between.
(A layer that mixed the ffn dimension, a layernorm over it say, would not allow this.)

``--swiglu`` (a gated linear unit with SiLU, as in PaLM and LLaMA) makes fc1 twice as wide:
its output is [gate | up], and the MLP computes silu(gate) * up before fc2. The product pairs
element j of the gate with element j of up, so a rank must hold *matching* slices of both.
fc1's weight is therefore split with stride 2: the full [2·ffn, h] matrix is cut into 2p
pieces and rank r keeps pieces r (its part of the gate) and p + r (its part of up), stacked as
[gate_r | up_r]. Splitting that in two halves gives the rank exactly its gate and up slices,
so the gating stays elementwise and fc2 still needs no exchange.
"""

from __future__ import annotations

import torch

from minitron.core.fusions.fused_bias_gelu import bias_gelu_impl
from minitron.core.fusions.fused_bias_swiglu import bias_swiglu_impl
from minitron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from minitron.core.transformer.module import MegatronModule
from minitron.trace import traced


def mlp_activation(config):
    """What runs between fc1 and fc2: the activation, or with --swiglu / --quick-geglu the gated
    unit over fc1's [gate | up] halves. The experts (moe/experts*.py) use the same, their fc1 cut
    the same way.

    gpt-oss's unit (--quick-geglu --glu-linear-offset 1 --activation-func-clamp-value 7) adds two
    things: ``up + offset``, so a closed gate times a zero up is no longer the only way to pass
    nothing (the linear half starts around 1, like a residual); and a clamp, gate <= v and up in
    [-v, v], which bounds the product and so the activations' outliers."""
    act, offset, clamp = config.activation_func, config.glu_linear_offset, config.activation_func_clamp_value
    if not config.gated_linear_unit:
        return act

    def glu(x):
        gate, up = torch.chunk(x, 2, dim=-1)   # this rank's [gate_r | up_r]
        if clamp is not None:
            gate, up = gate.clamp(max=clamp), up.clamp(min=-clamp, max=clamp)
        return act(gate) * (up + offset) if offset else act(gate) * up
    return glu


class MLP(MegatronModule):
    def __init__(self, config):
        super().__init__(config)
        ffn = config.ffn_hidden_size
        gated = config.gated_linear_unit
        self.linear_fc1 = ColumnParallelLinear(
            config.hidden_size, 2 * ffn if gated else ffn, config=config,
            init_method=config.init_method, bias=config.add_bias_linear,
            gather_output=False, skip_bias_add=True, stride=2 if gated else 1)
        self.activation_func = mlp_activation(config)
        self.linear_fc2 = RowParallelLinear(
            ffn, config.hidden_size, config=config,
            init_method=config.output_layer_init_method, bias=config.add_bias_linear,
            input_is_parallel=True, skip_bias_add=True)

    @traced
    def forward(self, hidden_states):
        """[s, b, h] -> (output [s, b, h], bias): fc2's bias is left for the residual add."""
        intermediate, bias = self.linear_fc1(hidden_states)      # [s, b, ffn/p] (x2 if gated)
        if self.config.bias_activation_fusion:   # opt-in: bias + activation as one compiled kernel
            fused = bias_swiglu_impl if self.config.gated_linear_unit else bias_gelu_impl
            return self.linear_fc2(fused(intermediate, bias))
        if bias is not None:
            # Megatron fuses bias + GeLU into one kernel. Adding in place gets most of that on
            # CPU: no second [s, b, ffn] tensor to allocate (and, for glibc, fault in) per
            # layer and micro-batch. Safe for autograd: fc1's backward keeps its input and
            # weight, never its output. Not when the output is a view (ZeRO-3's hooks return
            # views of it): autograd forbids changing those in place.
            if intermediate._is_view():
                intermediate = intermediate + bias
            else:
                intermediate = intermediate.add_(bias)
        intermediate = self.activation_func(intermediate)
        return self.linear_fc2(intermediate)
