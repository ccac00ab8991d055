"""One transformer layer, pre-layernorm (GPT-2 style): two residual branches.

    x = x + dropout(attention(layernorm(x)) + bias)
    x = x + dropout(mlp(layernorm(x)) + bias)

With experts (moe/), the MLP of an MoE layer is an MoELayer: same input, same output.

Activations are [s, b, h], Megatron's layout: sequence first. With sequence parallelism the
layer receives and returns [s/p, b, h], this rank's part of the sequence; the layernorms,
dropouts and residual adds work on that part, and the parallel linears gather and scatter.
"""

from __future__ import annotations

import torch

from minitron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from minitron.core.tensor_parallel.random import checkpoint as tensor_parallel_checkpoint
from minitron.core.transformer.attention import SelfAttention
from minitron.core.transformer.mlp import MLP
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.moe.moe_layer import MoELayer
from minitron.core.transformer.multi_latent_attention import MLASelfAttention
from minitron.core.transformer.torch_norm import WrappedTorchNorm
from minitron.trace import traced
from minitron.trace.recorder import short_value
from minitron.core.layer_patterns import moe_layer_pattern


def is_moe_layer(config, layer_number: int) -> bool:
    """With experts, layers 1, 1 + f, 1 + 2f, ... (f = moe_layer_freq), or those a 0/1 list marks,
    get an MoELayer as their MLP."""
    return (config.num_moe_experts is not None
            and moe_layer_pattern(config.moe_layer_freq, config.num_layers)[layer_number - 1] == 1)


class TransformerLayer(MegatronModule):
    def __init__(self, config, layer_number: int = 1, is_mtp_layer: bool = False):
        super().__init__(config)
        self.layer_number = layer_number  # 1-based, counted over the whole model (an MTP layer: its depth)
        self.input_layernorm = WrappedTorchNorm(config, config.hidden_size)
        # Megatron's layer spec picks the attention: MLA (--multi-latent-attention) or the usual one.
        attention = MLASelfAttention if config.multi_latent_attention else SelfAttention
        self.self_attention = attention(config, layer_number)
        self.pre_mlp_layernorm = WrappedTorchNorm(config, config.hidden_size)
        # A multi-token-prediction layer is built like the decoder's last; its experts and router
        # count as layer num_layers + depth (their own seeds, their own slot in the MoE log).
        moe_number = config.num_layers + layer_number if is_mtp_layer else layer_number
        self.mlp = (MoELayer(config, moe_number) if is_moe_layer(config, min(moe_number, config.num_layers))
                    else MLP(config))
        # --recompute-modules mlp (selective): keep only the dense MLP's input, recompute its
        # fc1 output and activation in backward (an MoE layer's MLP is the "moe" module)
        self.recompute_mlp = (config.recompute_granularity == "selective" and isinstance(self.mlp, MLP)
                              and "mlp" in (config.recompute_modules or ()))

    @traced(args=lambda self, hidden_states, attention_mask=None, rotary_pos_emb=None: {
        "layer_number": self.layer_number, "hidden_states": short_value(hidden_states)})
    def forward(self, hidden_states: torch.Tensor, attention_mask=None, rotary_pos_emb=None) -> torch.Tensor:
        p = self.config.hidden_dropout
        # residual + dropout(x + bias): plain ops, or one compiled kernel with --bias-dropout-fusion
        bias_dropout_add = get_bias_dropout_add(self.training, self.config.bias_dropout_fusion)
        residual = hidden_states
        attention_out = self.self_attention(self.input_layernorm(hidden_states), attention_mask,
                                            rotary_pos_emb=rotary_pos_emb)
        hidden_states = bias_dropout_add(attention_out, residual, p)

        residual = hidden_states
        mlp_input = self.pre_mlp_layernorm(hidden_states)
        if self.recompute_mlp and self.training:
            # Only the output goes through the checkpoint: fc2's bias (skip_bias_add) is a
            # parameter, which a checkpoint returning it would take for an output of its own.
            bias = []

            def mlp_output(x):
                output, b = self.mlp(x)
                bias[:] = [b]
                return output
            mlp_out = (tensor_parallel_checkpoint(mlp_output, False, mlp_input), bias[0])
        else:
            mlp_out = self.mlp(mlp_input)
        return bias_dropout_add(mlp_out, residual, p)
