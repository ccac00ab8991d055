"""TopKRouter: which k experts each token goes to, and with what weight.

    logits = x W^T                       [T, E]   one score per token and expert
    top-k of each row                    the k experts a token is sent to (routing_map)
    softmax over those k logits          the weights of their outputs (probs)

(Megatron's default order, ``moe_router_pre_softmax`` off: choose on the raw logits, then
normalise over the chosen k, so a token's weights always sum to one.)

The router is a dense parameter: it is replicated on every rank and reduced over data parallel
like a layernorm. Under sequence parallelism each tensor-parallel rank routes only its part of
the sequence, so its gradient is partial and is summed over tp (``sequence_parallel`` mark).

With --moe-expert-capacity-factor the choices are then capped per expert (tokens beyond an
expert's capacity dropped, lowest probability first; moe_utils.apply_router_token_dropping).

While training, the load-balancing loss is computed from the *full* softmax over all E experts
and attached to ``probs`` (moe_utils.MoEAuxLossAutoScaler).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minitron.core import parallel_state
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.moe.moe_utils import (
    MoEAuxLossAutoScaler, apply_router_token_dropping, save_to_aux_losses_tracker,
    switch_load_balancing_loss_func,
)
from minitron.trace import traced
from minitron.trace.recorder import short_value


class TopKRouter(MegatronModule):
    def __init__(self, config, layer_number: int = 1):
        super().__init__(config)
        self.topk = config.moe_router_topk
        self.num_experts = config.num_moe_experts
        self.layer_number = layer_number
        # No bias: a per-expert constant would shift every token's choice alike.
        self.weight = torch.nn.Parameter(torch.empty(self.num_experts, config.hidden_size,
                                                     dtype=config.params_dtype))
        if config.perform_initialization:
            with torch.no_grad():
                config.init_method(self.weight)
        self.weight.sequence_parallel = config.sequence_parallel

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        """[s, b, h] -> logits [s*b, E]."""
        return F.linear(input.reshape(-1, input.shape[-1]), self.weight)

    def routing(self, logits: torch.Tensor):
        """logits [T, E] -> (probs [T, E], zero off the chosen experts; routing_map [T, E] bool)."""
        top_logits, top_indices = torch.topk(logits, k=self.topk, dim=1)
        top_probs = torch.softmax(top_logits, dim=-1, dtype=torch.float32).type_as(logits)
        probs = torch.zeros_like(logits).scatter(1, top_indices, top_probs)
        routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top_indices, True)
        chosen = routing_map   # the balance loss judges the router's choices, before any drop
        if self.config.moe_expert_capacity_factor is not None:
            probs, routing_map = apply_router_token_dropping(
                probs, routing_map, self.topk, self.config.moe_expert_capacity_factor,
                self.config.moe_pad_expert_input_to_capacity)
        if self.training and torch.is_grad_enabled() and self.config.moe_aux_loss_coeff > 0:
            probs = self.apply_load_balancing_loss(logits, chosen, probs)
        return probs, routing_map

    def apply_load_balancing_loss(self, logits, routing_map, probs):
        """Compute the switch loss over the micro-batch's tokens and hang it on ``probs``.

        The tokens of one micro-batch may be spread over the tensor-parallel ranks (sequence
        parallel) and the context-parallel ranks: the counts per expert are summed over that
        tp x cp group, so f_i is the micro-batch's, as in the serial model.
        """
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
        group = parallel_state.get_tensor_and_context_parallel_group()
        tokens_per_expert = routing_map.sum(dim=0).float()
        if group.size() > 1:
            torch.distributed.all_reduce(tokens_per_expert, group=group)
        total_num_tokens = logits.shape[0] * group.size()
        coeff = self.config.moe_aux_loss_coeff
        aux_loss = switch_load_balancing_loss_func(scores, tokens_per_expert, total_num_tokens, self.topk,
                                                   self.num_experts, coeff)
        save_to_aux_losses_tracker("load_balancing_loss", aux_loss / coeff, self.layer_number,
                                   self.config.num_layers)
        return MoEAuxLossAutoScaler.apply(probs, aux_loss)

    @traced(args=lambda self, input: {"input": short_value(input), "experts": self.num_experts,
                                      "topk": self.topk})
    def forward(self, input: torch.Tensor):
        return self.routing(self.gating(input))
