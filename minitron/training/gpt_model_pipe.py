"""The GPT as a PipelineModule, as Megatron-DeepSpeed builds it for ``--deepspeed`` with a
pipeline (its GPTModelPipe): the same pieces as GPTModel (core/models/gpt/gpt_model.py), laid
out as a list for DeepSpeed to cut.

    TiedLayerSpec("embed", EmbeddingPipe)        tokens, positions -> hidden [s, b, h]
    LayerSpec(TransformerLayerPipe, n)  x L      hidden -> hidden
    LayerSpec(FinalNormPipe)                     the final layernorm
    TiedLayerSpec("embed", ..., forward_fn=_logits)   hidden -> logits [s, b, V], with the
                                                 embedding's own matrix (the output head)
    loss_fn = _loss                              logits, (labels, loss_mask) -> the mean loss

The list is cut by ``partition_method="type:TransformerLayerPipe"`` (Megatron-DeepSpeed's
"type:transformer"): the transformer layers are spread evenly and the embedding and head go
with the first and last of them. With --untie-embeddings-and-output-weights the head is a layer
of its own (OutputPipe). Each layer draws its initial weights from the seed of its global number
(core/init_rng.py), as in GPTModel, so the stages hold exactly the serial model's weights.

This path runs causal attention without a mask (the dataloader's mask is causal) and learned
absolute positions; tensor parallelism stays with Megatron's own pipeline (deepspeed_arguments).
"""

from __future__ import annotations

import torch

from minitron.core.init_rng import layer_init_rng
from minitron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from minitron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from minitron.core.tensor_parallel.layers import ColumnParallelLinear
from minitron.core.transformer.torch_norm import WrappedTorchNorm
from minitron.core.transformer.transformer_layer import TransformerLayer
from minitron.runtime.pipe import LayerSpec, PipelineModule, PipeModelDataParallelTopology, TiedLayerSpec


class EmbeddingPipe(torch.nn.Module):
    """The embedding, and (weightless) the head that reads its matrix when tied."""

    def __init__(self, config, vocab_size: int, max_sequence_length: int):
        super().__init__()
        with layer_init_rng(config, 0):
            self.embedding = LanguageModelEmbedding(config, vocab_size, max_sequence_length)
        self.output_layer = ColumnParallelLinear(config.hidden_size, vocab_size, config=config,
                                                 init_method=config.init_method, bias=False,
                                                 skip_weight_param_allocation=True)

    def forward(self, inputs):
        tokens, position_ids = inputs
        return self.embedding(tokens, position_ids)


def _logits(embedding: EmbeddingPipe, hidden: torch.Tensor) -> torch.Tensor:
    """The output head of a tied model: hidden [s, b, h] times the embedding matrix."""
    logits, _ = embedding.output_layer(hidden, weight=embedding.embedding.word_embeddings.weight)
    return logits


class TransformerLayerPipe(torch.nn.Module):
    def __init__(self, config, layer_number: int):
        super().__init__()
        with layer_init_rng(config, layer_number):   # the weights GPTModel gives layer n
            self.layer = TransformerLayer(config, layer_number=layer_number)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.layer(hidden, None)   # None: causal (see the module docstring)


class FinalNormPipe(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.norm = WrappedTorchNorm(config, config.hidden_size)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.norm(hidden)


class OutputPipe(torch.nn.Module):
    """An untied output layer, with the weights GPTModel's gets (seed number L + 1)."""

    def __init__(self, config, vocab_size: int):
        super().__init__()
        with layer_init_rng(config, config.num_layers + 1):
            self.output_layer = ColumnParallelLinear(config.hidden_size, vocab_size, config=config,
                                                     init_method=config.init_method, bias=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.output_layer(hidden)[0]


def _loss(logits: torch.Tensor, labels) -> torch.Tensor:
    """Megatron's loss of one micro-batch: per-token cross entropy, averaged over the tokens
    the mask keeps (pretrain_gpt's loss_func, divided by its count as the schedule does)."""
    tokens, loss_mask = labels
    losses = vocab_parallel_cross_entropy(logits, tokens.transpose(0, 1).contiguous()).transpose(0, 1)
    mask = loss_mask.view(-1).float()
    return torch.sum(losses.float().reshape(-1) * mask) / mask.sum().clamp(min=1)


def gpt_model_pipe(config, vocab_size: int, max_sequence_length: int, tied: bool, pp: int, dp: int) -> PipelineModule:
    """The layer list, cut into ``pp`` stages over a (pipe, data, model) topology whose order is
    Megatron's (see runtime/pipe/topology.py), so stage and data rank agree with parallel_state."""
    specs = [TiedLayerSpec("embed", EmbeddingPipe, config, vocab_size, max_sequence_length,
                           tied_weight_attr="embedding.word_embeddings.weight")]
    specs += [LayerSpec(TransformerLayerPipe, config, n) for n in range(1, config.num_layers + 1)]
    specs.append(LayerSpec(FinalNormPipe, config))
    if tied:
        specs.append(TiedLayerSpec("embed", EmbeddingPipe, config, vocab_size, max_sequence_length,
                                   forward_fn=_logits, tied_weight_attr="embedding.word_embeddings.weight"))
    else:
        specs.append(LayerSpec(OutputPipe, config, vocab_size))
    topology = PipeModelDataParallelTopology(num_pp=pp, num_mp=1, num_dp=dp)
    # checkpointable_layers: a pipeline.activation_checkpoint_interval recomputes transformer layers
    # only, as DeepSpeed does for Megatron-DeepSpeed's GPTModelPipe; a checkpointed embedding, whose
    # input (token ids) cannot require grad, would get no gradient from the reentrant checkpoint
    return PipelineModule(specs, topology=topology, loss_fn=_loss, partition_method="type:TransformerLayerPipe",
                          checkpointable_layers=["TransformerLayerPipe"])
