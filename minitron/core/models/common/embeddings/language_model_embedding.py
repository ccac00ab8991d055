"""Token ids -> the first hidden states: word embedding + learned position embedding.

(With ``--position-embedding-type rope`` there is no position table: position enters inside
attention instead, see rotary_pos_embedding.py. With ``none`` there is none at all: a causal
model can still tell positions apart, since token i sees exactly i + 1 tokens.)

    input_ids [b, s] --VocabParallelEmbedding--> [b, s, h]   (vocabulary split, all-reduced)
    position_ids [b, s] --Embedding-------------> [b, s, h]   (small: replicated on every rank)
    sum, transpose to [s, b, h], dropout

The transpose is where Megatron's sequence-first layout begins: from here on every activation
is [s, b, h]. With sequence parallelism each rank then keeps only its part of the sequence,
[s/p, b, h], before the dropout.
"""

from __future__ import annotations

import torch

from minitron.core.tensor_parallel.layers import VocabParallelEmbedding, init_device
from minitron.core.tensor_parallel.mappings import scatter_to_sequence_parallel_region
from minitron.core.tensor_parallel.random import get_cuda_rng_tracker
from minitron.core.transformer.module import MegatronModule
from minitron.trace import traced
from minitron.trace.recorder import short_value

# Megatron 0.19's choices that minitron builds (its mrope and relative are refused by
# validate_args, by name).
POSITION_EMBEDDING_TYPES = ("learned_absolute", "rope", "yarn", "none")


class LanguageModelEmbedding(MegatronModule):
    def __init__(self, config, vocab_size: int, max_sequence_length: int,
                 position_embedding_type: str = "learned_absolute"):
        super().__init__(config)
        if position_embedding_type not in POSITION_EMBEDDING_TYPES:
            raise ValueError(f"position_embedding_type {position_embedding_type!r} is not available; "
                             f"minitron has {', '.join(POSITION_EMBEDDING_TYPES)}")
        self.vocab_size, self.max_sequence_length = vocab_size, max_sequence_length
        self.word_embeddings = VocabParallelEmbedding(
            vocab_size, config.hidden_size, init_method=config.init_method, config=config)
        # Only learned positions live here: rope enters inside attention (RotaryEmbedding), none nowhere.
        self.add_position_embedding = position_embedding_type == "learned_absolute"
        if self.add_position_embedding:
            self.position_embeddings = torch.nn.Embedding(max_sequence_length, config.hidden_size,
                                                          dtype=config.params_dtype, device=init_device())
            if config.perform_initialization:
                # Drawn on the CPU whatever the flags (Megatron's nn.Embedding is), then copied
                # in: a replicated table, the same on every rank of a TP group.
                table = torch.empty_like(self.position_embeddings.weight, device="cpu")  # host: drawn there
                config.init_method(table)
                with torch.no_grad():
                    self.position_embeddings.weight.copy_(table)
        self.embedding_dropout = torch.nn.Dropout(config.hidden_dropout)

    @traced(args=lambda self, input_ids, position_ids: {"input_ids": short_value(input_ids)})
    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.size(1) > self.max_sequence_length:
            raise ValueError(f"sequence length {input_ids.size(1)} exceeds max_sequence_length "
                             f"{self.max_sequence_length} (--max-position-embeddings)")
        embeddings = self.word_embeddings(input_ids)
        if self.add_position_embedding:
            embeddings = embeddings + self.position_embeddings(position_ids)
        embeddings = embeddings.transpose(0, 1).contiguous()   # [b, s, h] -> [s, b, h]
        if self.config.sequence_parallel:
            embeddings = scatter_to_sequence_parallel_region(embeddings)   # [s/p, b, h]
            # Each rank holds a different part of the sequence: independent dropout masks.
            with get_cuda_rng_tracker().fork():
                return self.embedding_dropout(embeddings)
        # Replicated on every TP rank: the default stream gives every rank the same mask.
        return self.embedding_dropout(embeddings)
