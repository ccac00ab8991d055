"""A hybrid stack's other layers: a transformer layer's two halves, each a layer of its own.

Megatron builds them from specs: '*' is a TransformerLayer whose MLP is an IdentityOp, '-' an
MLPLayer (a TransformerLayer whose attention is one), 'E' the same with an MoE as its MLP.
Here they are two small classes; the module names inside (input_layernorm, self_attention,
pre_mlp_layernorm, mlp) are the transformer layer's, so the state-dict keys are Megatron's.
"""

from __future__ import annotations

import torch

from minitron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from minitron.core.transformer.attention import SelfAttention
from minitron.core.transformer.mlp import MLP
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.moe.moe_layer import MoELayer
from minitron.core.transformer.torch_norm import WrappedTorchNorm
from minitron.trace import traced
from minitron.trace.recorder import short_value

_ARGS = (lambda self, hidden_states, attention_mask=None, rotary_pos_emb=None:
         {"layer_number": self.layer_number, "hidden_states": short_value(hidden_states)})


class AttentionLayer(MegatronModule):
    """'*': x = x + dropout(attention(norm(x)))."""

    def __init__(self, config, layer_number: int = 1):
        super().__init__(config)
        self.layer_number = layer_number
        self.input_layernorm = WrappedTorchNorm(config, config.hidden_size)
        self.self_attention = SelfAttention(config, layer_number)

    @traced(args=_ARGS)
    def forward(self, hidden_states: torch.Tensor, attention_mask=None, rotary_pos_emb=None) -> torch.Tensor:
        out = self.self_attention(self.input_layernorm(hidden_states), attention_mask, rotary_pos_emb=rotary_pos_emb)
        bias_dropout_add = get_bias_dropout_add(self.training, self.config.bias_dropout_fusion)
        return bias_dropout_add(out, hidden_states, self.config.hidden_dropout)


class MLPLayer(MegatronModule):
    """'-' (dense) or 'E' (``moe=True``): x = x + dropout(mlp(norm(x)))."""

    def __init__(self, config, layer_number: int = 1, moe: bool = False):
        super().__init__(config)
        self.layer_number = layer_number
        self.pre_mlp_layernorm = WrappedTorchNorm(config, config.hidden_size)
        self.mlp = MoELayer(config, layer_number) if moe else MLP(config)

    @traced(args=_ARGS)
    def forward(self, hidden_states: torch.Tensor, attention_mask=None, rotary_pos_emb=None) -> torch.Tensor:
        bias_dropout_add = get_bias_dropout_add(self.training, self.config.bias_dropout_fusion)
        return bias_dropout_add(self.mlp(self.pre_mlp_layernorm(hidden_states)), hidden_states,
                                self.config.hidden_dropout)
