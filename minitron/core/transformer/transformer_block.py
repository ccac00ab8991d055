"""The stack of transformer layers this pipeline stage owns, plus the final layernorm.

With pipeline parallelism each stage builds only its share of the layers: stage r of p holds
layers [r*L/p, (r+1)*L/p). A stage other than the first gets its input from the previous stage
through ``set_input_tensor`` (the pipeline schedule calls it) instead of from the embedding.
Only the last stage (``post_process``) applies the final layernorm.

With ``--recompute-granularity full`` the block is also where activation recomputation happens:
``_checkpointed_forward`` runs the layers inside ``tensor_parallel.checkpoint``, which keeps a
chunk's input and recomputes the rest in backward (or inside DeepSpeed's checkpoint, which may keep
a tensor-parallel slice of it: --deepspeed-activation-checkpointing, runtime/activation_checkpointing).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from minitron.core import parallel_state
from minitron.core.fp8_utils import get_fp8_context
from minitron.core.init_rng import layer_init_rng
from minitron.core.tensor_parallel.random import checkpoint as tensor_parallel_checkpoint
from minitron.core.tensor_parallel.random import checkpoint_replacement, get_cuda_rng_tracker
from minitron.core.transformer.attention import is_causal_mask
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.pipeline_parallel_layer_layout import counts_from, layer_counts, stage_layers
from minitron.core.transformer.torch_norm import WrappedTorchNorm
from minitron.core.transformer.transformer_layer import TransformerLayer
from minitron.core.transformer.utils import block_sharded_state_dict
from minitron.trace import traced
from minitron.trace.recorder import short_value


def _stage_layers(config, vp_stage: int | None) -> range:
    """This rank's chunk ``vp_stage``: its layers' global indices. Even or uneven, the split
    lives in pipeline_parallel_layer_layout.py (torch-free, shared with the estimate)."""
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    counts = counts_from(config) if pp_size == config.pipeline_model_parallel_size else \
        layer_counts(config.num_layers, pp_size, config.virtual_pipeline_model_parallel_size)  # a bare config
    return stage_layers(counts, pp_size, parallel_state.get_pipeline_model_parallel_rank(), vp_stage)


def get_transformer_layer_offset(config, vp_stage: int | None = None) -> int:
    """How many layers come before this stage's first one (its layer numbers start after)."""
    return _stage_layers(config, vp_stage).start


def get_num_layers_to_build(config, vp_stage: int | None = None) -> int:
    return len(_stage_layers(config, vp_stage))


class TransformerBlock(MegatronModule):
    def __init__(self, config, pre_process: bool = True, post_process: bool = True,
                 vp_stage: int | None = None):
        super().__init__(config)
        self.pre_process, self.post_process = pre_process, post_process
        offset = get_transformer_layer_offset(config, vp_stage)
        layers = []
        for i in range(get_num_layers_to_build(config, vp_stage)):
            with layer_init_rng(config, offset + i + 1):  # same weights whichever stage builds it
                layers.append(TransformerLayer(config, layer_number=offset + i + 1))
        self.layers = torch.nn.ModuleList(layers)
        self.final_layernorm = WrappedTorchNorm(config, config.hidden_size) if post_process else None
        self.input_tensor = None

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """Layers keyed by their global number: the same keys at any pp / vp (transformer/utils.py)."""
        return block_sharded_state_dict(self, prefix, sharded_offsets, metadata)

    def set_input_tensor(self, input_tensor: torch.Tensor) -> None:
        """The activations received from the previous pipeline stage, used instead of forward's."""
        self.input_tensor = input_tensor

    def _checkpointed_forward(self, hidden_states, attention_mask, rotary_pos_emb):
        """Full recomputation: run the layers in chunks whose activations are dropped after
        forward and recomputed in backward; only each chunk's input is kept.

        uniform: chunks of ``recompute_num_layers`` layers, all of them recomputed: memory
                 falls to one input per chunk, every layer is computed twice.
        block:   the first ``recompute_num_layers`` layers of this stage recomputed one by
                 one, the rest run normally: a knob to spend just the memory there is.
        """
        def custom(start: int, end: int):
            def custom_forward(hidden_states, attention_mask, rotary_pos_emb):
                for layer in self.layers[start:end]:
                    hidden_states = layer(hidden_states, attention_mask, rotary_pos_emb=rotary_pos_emb)
                return hidden_states
            return custom_forward

        def checkpoint(function, *args):
            # Megatron-DeepSpeed's swap: once deepspeed.checkpointing is configured
            # (--deepspeed-activation-checkpointing), its checkpoint keeps the chunk inputs
            # (ZeRO-R: partitioned across TP, or on the host); otherwise Megatron's keeps them whole.
            deepspeed_checkpoint = checkpoint_replacement()
            if deepspeed_checkpoint is not None:
                return deepspeed_checkpoint(function, *args)
            return tensor_parallel_checkpoint(function, self.config.distribute_saved_activations, *args)

        n, num_layers = self.config.recompute_num_layers, len(self.layers)
        if self.config.recompute_method == "uniform":
            for start in range(0, num_layers, n):
                hidden_states = checkpoint(custom(start, min(start + n, num_layers)),
                                           hidden_states, attention_mask, rotary_pos_emb)
        elif self.config.recompute_method == "block":
            for index in range(num_layers):
                if index < n:
                    hidden_states = checkpoint(custom(index, index + 1), hidden_states, attention_mask, rotary_pos_emb)
                else:
                    hidden_states = custom(index, index + 1)(hidden_states, attention_mask, rotary_pos_emb)
        else:
            raise ValueError(f"invalid recompute_method {self.config.recompute_method!r}")
        return hidden_states

    @traced(args=lambda self, hidden_states, attention_mask=None, rotary_pos_emb=None: {
        "hidden_states": short_value(hidden_states if self.pre_process else self.input_tensor),
        "layers": [layer.layer_number for layer in self.layers]})
    def forward(self, hidden_states, attention_mask=None, rotary_pos_emb=None):
        if not self.pre_process:
            hidden_states = self.input_tensor
        if attention_mask is not None and is_causal_mask(attention_mask):
            # The data loader's mask is plain causal unless documents reset it. None says the
            # same to the attention and lets torch's fused kernel skip the hidden half of the
            # scores instead of computing and masking it: same numbers, 2-3% of a CPU step.
            # (Megatron's GPT layer spec declares attn_mask_type=causal for the same reason.)
            attention_mask = None
        # With sequence parallelism every activation in the block is this rank's part of the
        # sequence, so every dropout in it must draw differently on each TP rank.
        rng_context = get_cuda_rng_tracker().fork() if self.config.sequence_parallel else nullcontext()
        # --fp8-format: the linears inside the layers quantize (Megatron's outer fp8 context)
        with rng_context, get_fp8_context(self.config):
            if self.config.recompute_granularity == "full" and self.training:
                hidden_states = self._checkpointed_forward(hidden_states, attention_mask, rotary_pos_emb)
            else:
                for layer in self.layers:
                    hidden_states = layer(hidden_states, attention_mask, rotary_pos_emb=rotary_pos_emb)
        if self.final_layernorm is not None:
            hidden_states = self.final_layernorm(hidden_states)
        return hidden_states
