"""GPTModel: embedding -> transformer block -> output layer -> loss, cut for pipeline stages.

    input_ids [b, s] ─ LanguageModelEmbedding ─> [s, b, h]          pre_process (first stage)
                     ─ TransformerBlock ───────> [s, b, h]          every stage: its layers
                     ─ output_layer ───────────> logits [s, b, V/p] post_process (last stage)
                     ─ vocab_parallel_cross_entropy(logits, labels) ─> loss [b, s]

``pre_process`` / ``post_process`` say whether this stage holds the first or the last end of
the model. A middle pipeline stage has neither: it receives hidden states through
``set_input_tensor`` and returns hidden states. With one stage both are True.
"""

from __future__ import annotations

from minitron.core import parallel_state
from minitron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from minitron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from minitron.core.models.common.embeddings.yarn_rotary_pos_embedding import YarnRotaryEmbedding
from minitron.core.models.common.language_module.language_module import LanguageModule
from minitron.core.init_rng import layer_init_rng
from minitron.core.tensor_parallel.layers import ColumnParallelLinear
from minitron.core.transformer.multi_token_prediction import MultiTokenPredictionBlock, process_mtp_loss
from minitron.core.transformer.transformer_block import TransformerBlock
from minitron.trace import traced
from minitron.trace.recorder import short_value


# --8<-- [start:init]
class GPTModel(LanguageModule):
    def __init__(self, config, vocab_size: int, max_sequence_length: int,
                 pre_process: bool = True, post_process: bool = True,
                 parallel_output: bool = True, share_embeddings_and_output_weights: bool = False,
                 position_embedding_type: str = "learned_absolute", rotary_percent: float = 1.0,
                 rotary_base: float = 10000, rope_scaling: bool = False, rope_scaling_factor: float = 8.0,
                 seq_len_interpolation_factor: float | None = None, vp_stage: int | None = None):
        super().__init__(config)
        tp = parallel_state.get_tensor_model_parallel_world_size()
        if config.tensor_model_parallel_size != tp:
            raise ValueError(f"config.tensor_model_parallel_size is {config.tensor_model_parallel_size} "
                             f"but this rank's tensor-parallel group has {tp} ranks; make them agree")
        if vocab_size % tp:
            raise ValueError(f"vocab_size {vocab_size} is not divisible by tp {tp}: pad it first "
                             "(training.tokenizer._vocab_size_with_padding)")
        self.vocab_size, self.max_sequence_length = vocab_size, max_sequence_length
        self.pre_process, self.post_process = pre_process, post_process
        self.vp_stage = vp_stage  # which model chunk this is (None without a virtual pipeline)
        self.parallel_output = parallel_output
        self.share_embeddings_and_output_weights = share_embeddings_and_output_weights

        # Multi-token prediction lives on the last stage, and reads the embedding there too:
        # a copy, kept equal to the first stage's as a tied output layer is (LanguageModule).
        self.mtp_process = bool(config.mtp_num_layers) and post_process
        if pre_process or self.mtp_process:
            with layer_init_rng(config, 0):
                self.embedding = LanguageModelEmbedding(config, vocab_size, max_sequence_length,
                                                        position_embedding_type)
        self.position_embedding_type = position_embedding_type
        if position_embedding_type == "rope" and not config.multi_latent_attention:   # MLA makes its own
            # No weights: every stage makes its own angles (the layers of every stage need them).
            self.rotary_pos_emb = RotaryEmbedding(
                config.kv_channels, rotary_percent, rotary_interleaved=config.rotary_interleaved,
                seq_len_interpolation_factor=seq_len_interpolation_factor, rotary_base=rotary_base,
                rope_scaling=rope_scaling, rope_scaling_factor=rope_scaling_factor)
        elif position_embedding_type == "yarn" and not config.multi_latent_attention:
            self.rotary_pos_emb = YarnRotaryEmbedding(   # the config's yarn_* fields, as Megatron reads them
                config.kv_channels, rotary_percent, rotary_interleaved=config.rotary_interleaved,
                seq_len_interpolation_factor=seq_len_interpolation_factor, rotary_base=rotary_base,
                scaling_factor=config.yarn_rotary_scaling_factor,
                original_max_position_embeddings=config.yarn_original_max_position_embeddings,
                beta_fast=config.yarn_beta_fast, beta_slow=config.yarn_beta_slow, mscale=config.yarn_mscale,
                mscale_all_dim=config.yarn_mscale_all_dim,
                correction_range_round_to_int=config.yarn_correction_range_round_to_int)
        self.decoder = TransformerBlock(config, pre_process, post_process, vp_stage)
        if self.mtp_process:
            self.mtp = MultiTokenPredictionBlock(config)
        if post_process:
            # Column-parallel over the vocabulary: rank r computes logits for its ids only.
            # Tied and on the embedding's stage: no weight of its own, forward gets E.
            with layer_init_rng(config, config.num_layers + 1):
                self.output_layer = ColumnParallelLinear(
                    config.hidden_size, vocab_size, config=config, init_method=config.init_method,
                    bias=False, gather_output=not parallel_output,
                    # (with MTP the last stage holds the embedding's copy too, and reads that;
                    # Megatron allocates an output weight there that nothing reads)
                    skip_weight_param_allocation=(pre_process or self.mtp_process)
                    and share_embeddings_and_output_weights)
        self.setup_embeddings_and_output_layer()
# --8<-- [end:init]

    def _rotary_seq_len(self, decoder_input) -> int:
        """The whole sequence's length, from the part of it this rank's block receives."""
        block_input = decoder_input if self.pre_process else self.decoder.input_tensor
        length = block_input.size(0)
        if self.config.sequence_parallel:
            length *= self.config.tensor_model_parallel_size   # [s/tp, b, h] -> s
        return length * parallel_state.get_context_parallel_world_size()

    def set_input_tensor(self, input_tensor) -> None:
        """Hand the previous pipeline stage's activations to the block (schedules call this)."""
        if isinstance(input_tensor, (list, tuple)):
            if len(input_tensor) != 1:
                raise ValueError("GPTModel takes exactly one input tensor from the previous stage")
            input_tensor = input_tensor[0]
        self.decoder.set_input_tensor(input_tensor)

    @traced(args=lambda self, input_ids, position_ids, attention_mask=None, decoder_input=None,
            labels=None, loss_mask=None: {"input_ids": short_value(input_ids), "labels": short_value(labels),
                                          "pre_process": self.pre_process, "post_process": self.post_process})
    def forward(self, input_ids, position_ids, attention_mask=None, decoder_input=None, labels=None,
                loss_mask=None):
        """Per-token loss [b, s] when labels are given; else logits [b, s, V/p] (V if gathered).

        A stage without post_process returns its hidden states [s, b, h] for the next stage.
        ``attention_mask``: bool [b or 1, 1, s, s], True where attention is NOT allowed;
        None means causal.
        """
        if decoder_input is None and self.pre_process:
            decoder_input = self.embedding(input_ids, position_ids)
        rotary_pos_emb = None
        if self.position_embedding_type in ("rope", "yarn") and not self.config.multi_latent_attention:
            rotary_pos_emb = self.rotary_pos_emb(self._rotary_seq_len(decoder_input))
            if self.position_embedding_type == "yarn":   # (angles, mscale): the layers know mscale
                rotary_pos_emb = rotary_pos_emb[0]
        hidden_states = self.decoder(decoder_input, attention_mask, rotary_pos_emb=rotary_pos_emb)
        if not self.post_process:
            return hidden_states

        weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        if self.mtp_process:   # (loss_mask: the one forward_step masks the main loss with)
            hidden_states = self.mtp(input_ids, position_ids, hidden_states, attention_mask, rotary_pos_emb,
                                     embedding=self.embedding)
            if labels is None:   # logits: the main head's only
                hidden_states = hidden_states.chunk(1 + self.config.mtp_num_layers, dim=0)[0]
            else:
                hidden_states = process_mtp_loss(hidden_states, labels, loss_mask, self.output_layer, weight,
                                                 self.training, self.compute_language_model_loss, self.config)
        if labels is None:
            logits, _ = self.output_layer(hidden_states, weight=weight)
            return logits.transpose(0, 1).contiguous()
        # The loss always reads the vocabulary-parallel logits, even when parallel_output is
        # False: vocab_parallel_cross_entropy takes its input to be this rank's slice, and
        # gathered logits would be counted p times.
        logits, _ = self.output_layer(hidden_states, weight=weight, runtime_gather_output=False)
        return self.compute_language_model_loss(labels, logits)
