"""Multi-token prediction (DeepSeek-V3's MTP, --mtp-num-layers D): each position also learns
the tokens 2, 3, ..., D+1 ahead, through D more layers on the last pipeline stage.

    h0 = the decoder's output [s, b, h], after its final layernorm: what the main head reads
    for depth k = 1..D:
        ids      <- ids rolled left by one (position i now holds token i+k)
        e        =  embedding(ids)                       the model's own embedding, shared
        x        =  eh_proj([enorm(e), hnorm(h_{k-1})])  [s, b, 2h] -> [s, b, h]
        h_k      =  final_layernorm(transformer_layer(x))
    loss_k   =  cross_entropy(output_layer(h_k), labels rolled left k times), masked likewise
    mtp loss =  mtp_loss_scaling_factor / D x sum over k of loss_k (each a mean over its tokens)

Position i at depth k predicts token i+k+1 from the causal chain h_{k-1}[i] (which saw tokens up
to i+k-1) and the embedding of token i+k: the chain is kept, as DeepSeek-V3 keeps it. The last k
positions have nothing left to predict; the roll fills them with zeros and the rolled loss mask
leaves them out. The output layer (and the embedding) are the main model's: only the norms, the
projection and the layer are new parameters.

The MTP losses are not added to the language-model loss the schedule sees; like MoE's aux loss
they are hung on the main hidden states (MTPLossAutoScaler), so the one backward the schedule
runs also runs theirs, scaled like the main loss. ``save_to_mtp_tracker`` keeps each depth's
value for the iteration log ("mtp_1 loss", ...).
"""

from __future__ import annotations

from contextlib import nullcontext

import torch

from minitron.core import parallel_state
from minitron.core.fp8_utils import get_fp8_context
from minitron.core.init_rng import layer_init_rng
# MTPLossAutoScaler: Megatron's name here; it sits beside the schedule, which sets its scale.
from minitron.core.pipeline_parallel.loss_autoscalers import MTPLossAutoScaler
from minitron.core.tensor_parallel.layers import ColumnParallelLinear
from minitron.core.tensor_parallel.mappings import (
    gather_from_tensor_model_parallel_region, scatter_to_sequence_parallel_region,
)
from minitron.core.tensor_parallel.random import get_cuda_rng_tracker
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.torch_norm import WrappedTorchNorm
from minitron.core.transformer.transformer_layer import TransformerLayer
from minitron.trace import traced
from minitron.trace.recorder import short_value


def roll_tensor(tensor: torch.Tensor, shifts: int = -1, dims: int = -1):
    """``tensor`` moved ``shifts`` places along ``dims``, the places that wrap around zeroed;
    and the sum of the result (for a rolled loss mask: its token count). One rank holds the whole
    sequence (context parallelism would need the neighbours' ends; validate_args refuses it)."""
    rolled = torch.roll(tensor, shifts=shifts, dims=dims)
    rolled.select(dims, shifts).fill_(0)
    return rolled, rolled.sum()


# depth k -> the sum over this step's micro-batches of this rank's loss_k (a mean over its tokens)
_MTP_TRACKER: dict[int, torch.Tensor] = {}


def save_to_mtp_tracker(loss: torch.Tensor, depth: int) -> None:
    _MTP_TRACKER[depth] = _MTP_TRACKER.get(depth, 0) + loss.detach().float()


def track_mtp_metrics(loss_scale: float) -> dict[str, float]:
    """After a step, on the last pipeline stage: {"mtp_k loss": the mean over micro-batches and
    data-parallel replicas} (tensor-parallel ranks hold the same value; context parallel is refused)."""
    group = parallel_state.get_data_parallel_group(with_context_parallel=True)
    metrics = {}
    for depth in sorted(_MTP_TRACKER):
        value = _MTP_TRACKER[depth].reshape(1).clone()
        torch.distributed.all_reduce(value, group=group)
        metrics[f"mtp_{depth + 1} loss"] = (value / group.size() * loss_scale).item()
    _MTP_TRACKER.clear()
    return metrics


class MultiTokenPredictionLayer(MegatronModule):
    """Depth k's module (Megatron's names, so checkpoints share keys): enorm, hnorm, eh_proj,
    mtp_model_layer (a transformer layer like the decoder's last), final_layernorm."""

    def __init__(self, config, layer_number: int = 1):
        super().__init__(config)
        self.layer_number = layer_number   # 1..D
        # Weights drawn from a seed of their own (after the decoder's layers and the output
        # layer's), so every layout that builds this stage draws the same ones.
        with layer_init_rng(config, config.num_layers + 1 + layer_number):
            self.enorm = WrappedTorchNorm(config, config.hidden_size)
            self.hnorm = WrappedTorchNorm(config, config.hidden_size)
            # column-parallel, not gathered: each tp rank makes h/tp of the output channels
            self.eh_proj = ColumnParallelLinear(2 * config.hidden_size, config.hidden_size, config=config,
                                                init_method=config.init_method, gather_output=False, bias=False)
            self.mtp_model_layer = TransformerLayer(config, layer_number=layer_number, is_mtp_layer=True)
            self.final_layernorm = WrappedTorchNorm(config, config.hidden_size)

    def forward(self, input_ids, position_ids, hidden_states, attention_mask, rotary_pos_emb, embedding):
        input_ids, _ = roll_tensor(input_ids)
        position_ids, _ = roll_tensor(position_ids)
        decoder_input = embedding(input_ids, position_ids)   # [s, b, h] ([s/tp, b, h] with sp)
        rng_context = get_cuda_rng_tracker().fork() if self.config.sequence_parallel else nullcontext()
        with rng_context, get_fp8_context(self.config):
            # token i+k's embedding beside position i's state: [s, b, 2h] -> [s, b, h/tp]
            hidden_states = torch.cat((self.enorm(decoder_input), self.hnorm(hidden_states)), dim=-1)
            hidden_states, _ = self.eh_proj(hidden_states)
            hidden_states = gather_from_tensor_model_parallel_region(hidden_states)   # [s, b, h]
            if self.config.sequence_parallel:   # back to this rank's part of the sequence
                hidden_states = scatter_to_sequence_parallel_region(hidden_states)
            hidden_states = self.mtp_model_layer(hidden_states, attention_mask, rotary_pos_emb=rotary_pos_emb)
        return self.final_layernorm(hidden_states), input_ids, position_ids


class MultiTokenPredictionBlock(MegatronModule):
    """The D depths, one after another; returns [h0; h1; ...; hD] stacked along the sequence
    dimension, (D+1) s rows, the form Megatron hands to process_mtp_loss."""

    def __init__(self, config):
        super().__init__(config)
        self.layers = torch.nn.ModuleList(
            MultiTokenPredictionLayer(config, layer_number=k + 1) for k in range(config.mtp_num_layers))

    @traced(args=lambda self, input_ids, position_ids, hidden_states, *a, **k: {
        "depths": len(self.layers), "hidden_states": short_value(hidden_states)})
    def forward(self, input_ids, position_ids, hidden_states, attention_mask=None, rotary_pos_emb=None,
                embedding=None):
        states = [hidden_states]
        for layer in self.layers:
            hidden_states, input_ids, position_ids = layer(input_ids, position_ids, hidden_states,
                                                           attention_mask, rotary_pos_emb, embedding)
            states.append(hidden_states)
        return torch.cat(states, dim=0)


def process_mtp_loss(hidden_states, labels, loss_mask, output_layer, output_weight, is_training: bool,
                     compute_language_model_loss, config):
    """[h0; h1; ...; hD] -> h0, with the D MTP losses hung on it (module docstring)."""
    states = torch.chunk(hidden_states, 1 + config.mtp_num_layers, dim=0)
    hidden_states = states[0]
    mtp_labels = labels.clone()
    loss_mask = torch.ones_like(mtp_labels) if loss_mask is None else loss_mask
    original_num_tokens = loss_mask.sum()
    scale = config.mtp_loss_scaling_factor / config.mtp_num_layers
    for depth in range(config.mtp_num_layers):
        # the loss reads the vocabulary-parallel logits, as the main loss does
        logits, _ = output_layer(states[depth + 1], weight=output_weight, runtime_gather_output=False)
        mtp_labels, _ = roll_tensor(mtp_labels)
        loss_mask, num_tokens = roll_tensor(loss_mask)
        mtp_loss = (loss_mask * compute_language_model_loss(mtp_labels, logits)).sum()
        if is_training:
            save_to_mtp_tracker(mtp_loss * (num_tokens > 0) / num_tokens.clamp(min=1), depth)
        if config.calculate_per_token_loss:
            # finalize_model_grads divides every gradient by the main loss's token count: this
            # depth's fewer tokens are weighted back to a mean over its own
            mtp_loss = scale * mtp_loss * (original_num_tokens / num_tokens.clamp(min=1))
        else:
            mtp_loss = scale * mtp_loss / num_tokens.clamp(min=1)
        hidden_states = MTPLossAutoScaler.apply(hidden_states, mtp_loss)
    return hidden_states
