"""HybridModel: GPTModel's ends around a HybridStack (Megatron's models/hybrid/hybrid_model.py).

    input_ids ─ embedding (first stage) ─ HybridStack: M, *, -, E layers by the pattern
              ─ output layer, loss (last stage)

Everything but the middle is the GPT's: the same embedding, output layer and loss
(LanguageModule), the same pipeline hand-over. Megatron's HybridModel is its own class beside
GPTModel, and so is this one. Nemotron-H runs with ``--position-embedding-type none`` (the
Mamba layers see order through their scan and conv); rope and learned positions work as in a
GPT.
"""

from __future__ import annotations

from minitron.core import parallel_state
from minitron.core.init_rng import layer_init_rng
from minitron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from minitron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from minitron.core.models.common.language_module.language_module import LanguageModule
from minitron.core.ssm.mamba_block import HybridStack
from minitron.core.tensor_parallel.layers import ColumnParallelLinear
from minitron.trace import traced
from minitron.trace.recorder import short_value


class HybridModel(LanguageModule):
    def __init__(self, config, vocab_size: int, max_sequence_length: int, hybrid_layer_pattern: str,
                 pre_process: bool = True, post_process: bool = True, parallel_output: bool = True,
                 share_embeddings_and_output_weights: bool = False, position_embedding_type: str = "none",
                 rotary_percent: float = 1.0, rotary_base: float = 10000, vp_stage: int | None = None):
        super().__init__(config)
        tp = parallel_state.get_tensor_model_parallel_world_size()
        if vocab_size % tp:
            raise ValueError(f"vocab_size {vocab_size} is not divisible by tp {tp}: pad it first")
        if position_embedding_type not in ("learned_absolute", "rope", "none"):
            raise ValueError(f"HybridModel builds learned_absolute, rope or none positions, not {position_embedding_type!r}")
        self.vocab_size, self.max_sequence_length = vocab_size, max_sequence_length
        self.hybrid_layer_pattern = hybrid_layer_pattern
        self.pre_process, self.post_process, self.vp_stage = pre_process, post_process, vp_stage
        self.parallel_output = parallel_output
        self.share_embeddings_and_output_weights = share_embeddings_and_output_weights
        self.position_embedding_type = position_embedding_type
        if pre_process:
            with layer_init_rng(config, 0):
                self.embedding = LanguageModelEmbedding(config, vocab_size, max_sequence_length,
                                                        position_embedding_type)
        if position_embedding_type == "rope":
            self.rotary_pos_emb = RotaryEmbedding(config.kv_channels, rotary_percent,
                                                  rotary_interleaved=config.rotary_interleaved, rotary_base=rotary_base)
        self.decoder = HybridStack(config, hybrid_layer_pattern, pre_process, post_process, vp_stage)
        if post_process:
            with layer_init_rng(config, config.num_layers + 1):
                self.output_layer = ColumnParallelLinear(
                    config.hidden_size, vocab_size, config=config, init_method=config.init_method,
                    bias=False, gather_output=not parallel_output,
                    skip_weight_param_allocation=pre_process and share_embeddings_and_output_weights)
        self.setup_embeddings_and_output_layer()

    def set_input_tensor(self, input_tensor) -> None:
        """The previous pipeline stage's activations (the schedules call this), for the stack."""
        if isinstance(input_tensor, (list, tuple)):
            (input_tensor,) = input_tensor
        self.decoder.set_input_tensor(input_tensor)

    @traced(args=lambda self, input_ids, position_ids, attention_mask=None, decoder_input=None, labels=None,
            loss_mask=None: {"input_ids": short_value(input_ids), "pre_process": self.pre_process,
                             "post_process": self.post_process})
    def forward(self, input_ids, position_ids, attention_mask=None, decoder_input=None, labels=None,
                loss_mask=None):
        """As GPTModel.forward: per-token loss [b, s] with labels, else logits [b, s, V/p]; a stage
        without post_process returns its hidden states. (``loss_mask`` is taken for the GPT's
        forward step and not needed: there is no multi-token prediction here.)"""
        if decoder_input is None and self.pre_process:
            decoder_input = self.embedding(input_ids, position_ids)
        rotary_pos_emb = None
        if self.position_embedding_type == "rope":
            block_input = decoder_input if self.pre_process else self.decoder.input_tensor
            length = block_input.size(0) * (self.config.tensor_model_parallel_size if self.config.sequence_parallel
                                            else 1)
            rotary_pos_emb = self.rotary_pos_emb(length)
        hidden_states = self.decoder(decoder_input, attention_mask, rotary_pos_emb=rotary_pos_emb)
        if not self.post_process:
            return hidden_states
        weight = self.shared_embedding_or_output_weight() if self.share_embeddings_and_output_weights else None
        if labels is None:
            logits, _ = self.output_layer(hidden_states, weight=weight)
            return logits.transpose(0, 1).contiguous()
        logits, _ = self.output_layer(hidden_states, weight=weight, runtime_gather_output=False)
        return self.compute_language_model_loss(labels, logits)
