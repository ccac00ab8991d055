"""HybridModel: GPTModel's ends around a HybridStack (Megatron's models/hybrid/hybrid_model.py).

    input_ids ─ embedding (first stage) ─ HybridStack: M, *, -, E layers by the pattern
              ─ output layer, loss (last stage)

Everything but the middle is the GPT's, so the class is a GPTModel whose decoder is built from
the pattern: forward, the pipeline hand-over and the loss are inherited as they are. Nemotron-H
runs with ``--position-embedding-type none`` (the Mamba layers see order through their scan
and conv); rope and learned positions work as in a GPT.
"""

from __future__ import annotations

from minitron.core import parallel_state
from minitron.core.init_rng import layer_init_rng
from minitron.core.models.common.embeddings.language_model_embedding import LanguageModelEmbedding
from minitron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from minitron.core.models.common.language_module.language_module import LanguageModule
from minitron.core.models.gpt.gpt_model import GPTModel
from minitron.core.ssm.mamba_block import HybridStack
from minitron.core.tensor_parallel.layers import ColumnParallelLinear


class HybridModel(GPTModel):
    def __init__(self, config, vocab_size: int, max_sequence_length: int, hybrid_layer_pattern: str,
                 pre_process: bool = True, post_process: bool = True, parallel_output: bool = True,
                 share_embeddings_and_output_weights: bool = False, position_embedding_type: str = "none",
                 rotary_percent: float = 1.0, rotary_base: float = 10000, vp_stage: int | None = None):
        LanguageModule.__init__(self, config)   # not GPTModel's: that one builds a TransformerBlock
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
