"""HybridStack: the layers of one pipeline stage, built by the hybrid pattern, plus the final norm.

Megatron-Core 0.19 keeps it in megatron/core/models/hybrid/hybrid_block.py (core/ssm/mamba_block.py
re-exports it there, and MambaStack is its older name). It plays the TransformerBlock's part:
the stage's slice of the pattern (mamba_hybrid_layer_allocation.select_pipeline_segment) picks
each layer's class, layer numbers count over the whole stack, so a layer draws the same
initial weights whichever stage builds it; a stage other than the first reads the previous
stage's activations through ``set_input_tensor``; only the last applies ``final_norm``.
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from minitron.core import parallel_state
from minitron.core.init_rng import layer_init_rng
from minitron.core.ssm.mamba_checkpoint import hybrid_stack_sharded_state_dict
from minitron.core.ssm.mamba_hybrid_layer_allocation import Symbols, select_pipeline_segment
from minitron.core.ssm.mamba_layer import MambaLayer
from minitron.core.ssm.mlp_layer import AttentionLayer, MLPLayer
from minitron.core.tensor_parallel.random import get_cuda_rng_tracker
from minitron.core.transformer.attention import is_causal_mask
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.torch_norm import WrappedTorchNorm
from minitron.trace import traced
from minitron.trace.recorder import short_value


def build_hybrid_layer(config, symbol: str, layer_number: int) -> MegatronModule:
    if symbol == Symbols.MAMBA:
        return MambaLayer(config, layer_number)
    if symbol == Symbols.ATTENTION:
        return AttentionLayer(config, layer_number)
    if symbol in (Symbols.MLP, Symbols.MOE):
        return MLPLayer(config, layer_number, moe=symbol == Symbols.MOE)
    raise ValueError(f"hybrid layer symbol {symbol!r} is not built by minitron (M, *, - or E)")


class HybridStack(MegatronModule):
    def __init__(self, config, hybrid_layer_pattern: str, pre_process: bool = True, post_process: bool = True,
                 vp_stage: int | None = None):
        super().__init__(config)
        self.pre_process, self.post_process = pre_process, post_process
        self.layer_type_list, offset = select_pipeline_segment(
            hybrid_layer_pattern, parallel_state.get_pipeline_model_parallel_rank(),
            parallel_state.get_pipeline_model_parallel_world_size(), vp_stage)
        layers = []
        for i, symbol in enumerate(self.layer_type_list):
            with layer_init_rng(config, offset + i + 1):
                layers.append(build_hybrid_layer(config, symbol, offset + i + 1))
        self.layers = torch.nn.ModuleList(layers)
        self.num_layers_per_pipeline_rank = len(self.layers)
        self.final_norm = WrappedTorchNorm(config, config.hidden_size) if post_process else None
        self.input_tensor = None

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """Layers keyed by their global index, norms by Megatron's names (mamba_checkpoint.py)."""
        return hybrid_stack_sharded_state_dict(self, prefix, sharded_offsets, metadata)

    def set_input_tensor(self, input_tensor: torch.Tensor) -> None:
        self.input_tensor = input_tensor

    @traced(args=lambda self, hidden_states, attention_mask=None, rotary_pos_emb=None: {
        "hidden_states": short_value(hidden_states if self.pre_process else self.input_tensor),
        "layers": "".join(self.layer_type_list)})
    def forward(self, hidden_states, attention_mask=None, rotary_pos_emb=None):
        if not self.pre_process:
            hidden_states = self.input_tensor
        if attention_mask is not None and is_causal_mask(attention_mask):
            attention_mask = None   # plain causal: the attention's fused kernel knows it (as TransformerBlock)
        # With sequence parallelism each TP rank holds its own part of the sequence: dropout
        # there must draw differently per rank.
        with get_cuda_rng_tracker().fork() if self.config.sequence_parallel else nullcontext():
            for layer in self.layers:
                hidden_states = layer(hidden_states, attention_mask, rotary_pos_emb=rotary_pos_emb)
        if self.final_norm is not None:
            hidden_states = self.final_norm(hidden_states)
        return hidden_states


MambaStack = HybridStack   # Megatron's older name, still exported there
