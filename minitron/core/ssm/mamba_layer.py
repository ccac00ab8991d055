"""MambaLayer: one residual branch around the Mamba mixer (Megatron's core/ssm/mamba_layer.py).

    x = x + dropout(mixer(norm(x)))

A transformer layer has two branches (attention, then MLP); a hybrid model spells each half as
a layer of its own (mlp_layer.py), so a Mamba layer is only the sequence-mixing half. The norm
is the model's (--normalization); Megatron's hybrid spec fuses it into in_proj
(TELayerNormColumnParallelLinear), the same function under another module path.
"""

from __future__ import annotations

import torch

from minitron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from minitron.core.ssm.mamba_mixer import MambaMixer
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.torch_norm import WrappedTorchNorm
from minitron.trace import traced
from minitron.trace.recorder import short_value


class MambaLayer(MegatronModule):
    def __init__(self, config, layer_number: int = 1):
        super().__init__(config)
        self.layer_number = layer_number   # 1-based, over the whole stack
        self.mixer = MambaMixer(config, d_model=config.hidden_size, layer_number=layer_number)
        self.norm = WrappedTorchNorm(config, config.hidden_size)

    @traced(args=lambda self, hidden_states, attention_mask=None, rotary_pos_emb=None: {
        "layer_number": self.layer_number, "hidden_states": short_value(hidden_states)})
    def forward(self, hidden_states: torch.Tensor, attention_mask=None, rotary_pos_emb=None) -> torch.Tensor:
        """[s, b, h] -> [s, b, h]; the mask and rotary angles are the attention layers', unused here."""
        bias_dropout_add = get_bias_dropout_add(self.training, self.config.bias_dropout_fusion)
        return bias_dropout_add(self.mixer(self.norm(hidden_states)), hidden_states, self.config.hidden_dropout)
