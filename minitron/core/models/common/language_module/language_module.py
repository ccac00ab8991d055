"""LanguageModule: what every language model shares: the loss, and the tied embedding.

Tying: GPT uses the word-embedding matrix E [V, h] twice: to look tokens up on the way in,
and as the output layer on the way out (logits = hidden @ E^T). On one pipeline stage both
uses read the same Parameter and autograd adds the two gradients. With pipeline parallelism
the first stage has the embedding and the last stage the output layer, so the last stage
keeps a *copy*: it starts as zeros and one all-reduce over the embedding group (first + last
stage) fills it with the first stage's values. Later, the gradients of the two copies are
all-reduced over the same group every step, so the copies stay equal.
"""

from __future__ import annotations

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state
from minitron.core.fusions.fused_cross_entropy import fused_vocab_parallel_cross_entropy
from minitron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.utils import module_sharded_state_dict, tie_output_layer


class LanguageModule(MegatronModule):

    def compute_language_model_loss(self, labels: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """labels [b, s], this rank's logits [s, b, V/p] -> per-token loss [b, s]."""
        # --cross-entropy-loss-fusion: the same loss from compiled pieces (core/fusions/)
        cross_entropy = (fused_vocab_parallel_cross_entropy if self.config.cross_entropy_loss_fusion
                         else vocab_parallel_cross_entropy)
        loss = cross_entropy(logits, labels.transpose(0, 1).contiguous())
        return loss.transpose(0, 1).contiguous()

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """The default, with a tied output layer read from the embedding's key."""
        return tie_output_layer(module_sharded_state_dict(self, prefix, sharded_offsets, metadata), self, prefix)

    def shared_embedding_or_output_weight(self) -> torch.Tensor | None:
        """The tied matrix as this stage holds it: the embedding's, else the output layer's copy."""
        if self.pre_process or getattr(self, "mtp_process", False):   # MTP's stage holds a copy
            return self.embedding.word_embeddings.weight
        if self.post_process:
            return self.output_layer.weight
        return None

    def setup_embeddings_and_output_layer(self) -> None:
        mtp_process = getattr(self, "mtp_process", False)
        if self.pre_process or mtp_process:
            self.embedding.word_embeddings.weight.is_embedding_or_output_parameter = True
        if self.post_process and self.output_layer.weight is not None:
            self.output_layer.weight.is_embedding_or_output_parameter = True
        if not self.share_embeddings_and_output_weights and not mtp_process:
            return
        if parallel_state.get_pipeline_model_parallel_world_size() == 1:
            return  # one stage: the output layer reads the embedding's own Parameter
        if self.pre_process and not self.post_process:
            self.shared_embedding_or_output_weight().shared_embedding = True
        if (self.post_process and self.share_embeddings_and_output_weights or mtp_process) and not self.pre_process:
            # The last stage's copy: zeros, so that the sum below equals the first stage's values.
            weight = self.shared_embedding_or_output_weight()
            weight.data.fill_(0)
            weight.shared = True
            weight.shared_embedding = True
        if getattr(self.shared_embedding_or_output_weight(), "is_meta", False):
            return   # --init-model-with-meta-device: a shape has nothing to sum; the unit built for real will
        if parallel_state.is_rank_in_embedding_group(ignore_virtual=False, vp_stage=self.vp_stage):
            # On the device before the collective (NCCL moves only GPU memory), as Megatron
            # moves it here; the layers made it there already, so this is a no-op unless a
            # caller built the model elsewhere.
            weight = self.shared_embedding_or_output_weight()
            weight.data = weight.data.to(get_accelerator().current_device_name())
            torch.distributed.all_reduce(weight.data, group=parallel_state.get_embedding_group())
