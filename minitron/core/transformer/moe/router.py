"""TopKRouter: which k experts each token goes to, and with what weight.

    logits = x W^T (+ b)                 [T, E]   one score per token and expert
    [random logits]                      --moe-router-force-load-balancing (benchmarks)
    [z-loss]                             keeps the logits small (--moe-z-loss-coeff)
    scores, top-k                        the k experts a token is sent to (routing_map),
                                         [inside its best groups of experts] or [by Sinkhorn]
    weights of the chosen k              softmax over their logits, or normalised sigmoids (probs)
    [capacity]                           tokens beyond an expert's capacity dropped
    [balance loss]                       aux_loss, seq_aux_loss or global_aux_loss, hung on probs

The router is a dense parameter: it is replicated on every rank and reduced over data parallel
like a layernorm. Under sequence parallelism each tensor-parallel rank routes only its part of
the sequence, so its gradient is partial and is summed over tp (``sequence_parallel`` mark).
Its bias (with Megatron's default --add-bias-linear) is a learned per-expert constant added to
every token's logit: it moves an expert's share of the traffic up or down for all tokens alike.

The *expert bias* of aux-loss-free balancing (--moe-router-enable-expert-bias) is another
thing: not a parameter but a buffer, added to the sigmoid scores for the choice only, and moved
after each step by the counts of tokens each expert got (moe_utils.update_router_expert_bias).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minitron.core import parallel_state
from minitron.core.tensor_parallel.weight_init import init_device
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.moe.moe_logging import save_to_aux_losses_tracker
from minitron.core.transformer.moe.moe_utils import (
    MoEAuxLossAutoScaler, apply_random_logits, apply_router_token_dropping, compute_routing_scores_for_aux_loss,
    sinkhorn, switch_load_balancing_loss_func, topk_routing_with_score_function, z_loss_func,
)
from minitron.trace import traced
from minitron.trace.recorder import short_value

_ROUTER_DTYPES = {"fp32": torch.float32, "fp64": torch.float64}
# load-balancing type -> the name its loss is logged under
_BALANCE_LOSS_NAMES = {"aux_loss": "load_balancing_loss", "seq_aux_loss": "seq_load_balancing_loss",
                       "global_aux_loss": "global_load_balancing_loss"}


class TopKRouter(MegatronModule):
    def __init__(self, config, layer_number: int = 1):
        super().__init__(config)
        self.topk = config.moe_router_topk
        self.num_experts = config.num_moe_experts
        self.layer_number = layer_number
        self.routing_type = config.moe_router_load_balancing_type
        self.score_function = config.moe_router_score_function
        device = init_device()
        self.weight = torch.nn.Parameter(torch.empty(self.num_experts, config.hidden_size,
                                                     dtype=config.params_dtype, device=device))
        self.bias = (torch.nn.Parameter(torch.empty(self.num_experts, dtype=config.params_dtype, device=device))
                     if config.add_bias_linear else None)
        for param in (self.weight, self.bias):
            if param is None:
                continue
            if config.perform_initialization:   # Megatron draws the bias like the weight, not zeros
                # Drawn on the CPU in fp32 at any setting, as Megatron draws its router, then
                # cast and copied in: a bf16 run, or a GPU one, starts from the same values.
                drawn = torch.empty(param.shape, dtype=torch.float32)  # host: drawn there
                config.init_method(drawn)
                with torch.no_grad():
                    param.copy_(drawn)
            param.sequence_parallel = config.sequence_parallel
        if config.moe_router_enable_expert_bias:
            # Buffers, not parameters: no gradient, no optimizer. The counts are the step's
            # (not saved); the bias is the model's state (saved, and kept in fp32 whatever the
            # model's dtype, since steps of 1e-3 vanish in bf16).
            self.register_buffer("local_tokens_per_expert", torch.zeros(self.num_experts, device=device),
                                 persistent=False)
            self.register_buffer("expert_bias", torch.zeros(self.num_experts, device=device))
        else:
            self.local_tokens_per_expert = self.expert_bias = None
        if self.routing_type == "global_aux_loss":   # the step's counts so far, and micro-batches
            self.register_buffer("global_tokens_per_expert", torch.zeros(self.num_experts, device=device),
                                 persistent=False)
            self.register_buffer("ga_steps", torch.zeros([], device=device), persistent=False)

    def gating(self, input: torch.Tensor) -> torch.Tensor:
        """[s, b, h] -> logits [s, b, E], in --moe-router-dtype when given (fp32 routing of a bf16
        model: E small differences decide the top-k, and bf16 has 8 bits of mantissa)."""
        dtype = _ROUTER_DTYPES.get(self.config.moe_router_dtype, input.dtype)
        bias = None if self.bias is None else self.bias.to(dtype)
        return F.linear(input.to(dtype), self.weight.to(dtype), bias)

    def routing(self, logits: torch.Tensor):
        """logits [s, b, E] -> (probs [T, E], zero off the chosen experts; routing_map [T, E] bool)."""
        seq_length, batch = logits.shape[:2]
        logits = logits.reshape(-1, self.num_experts)
        logits = self.apply_z_loss(logits)
        if self.routing_type == "sinkhorn":
            probs, routing_map = self.sinkhorn_load_balancing(logits)
        else:
            probs, routing_map = topk_routing_with_score_function(
                logits, self.topk, use_pre_softmax=self.config.moe_router_pre_softmax,
                num_groups=self.config.moe_router_num_groups, group_topk=self.config.moe_router_group_topk,
                scaling_factor=self.config.moe_router_topk_scaling_factor, score_function=self.score_function,
                expert_bias=self.expert_bias)
        if self.config.moe_expert_capacity_factor is not None:
            probs, routing_map = apply_router_token_dropping(
                probs, routing_map, self.topk, self.config.moe_expert_capacity_factor,
                self.config.moe_pad_expert_input_to_capacity, self.config.moe_token_drop_policy)
        coeff = self.config.moe_aux_loss_coeff
        if self.training and torch.is_grad_enabled() and self.routing_type in _BALANCE_LOSS_NAMES and coeff > 0:
            # The balance loss judges the router's own choice: unbiased scores, before any drop.
            chosen, scores = compute_routing_scores_for_aux_loss(logits, self.topk, self.score_function)
            probs = self.apply_load_balancing_loss(probs, scores, chosen, seq_length, batch)
        if self.expert_bias is not None and torch.is_grad_enabled():   # not in eval or a recompute
            self.local_tokens_per_expert += routing_map.sum(dim=0)
        return probs, routing_map

    def sinkhorn_load_balancing(self, logits):
        """S-BASE: in training the top-k of the Sinkhorn-balanced exp(logits) (fp32, no gradient)
        chooses; the weights are the chosen experts' sigmoids (top-1) or softmax shares (top-k,
        over all E: they do not sum to one), unscaled. In eval the top-k of those scores chooses."""
        if self.topk == 1:
            scores = torch.sigmoid(logits)
        else:
            scores = torch.softmax(logits, dim=-1, dtype=torch.float32).type_as(logits)
        with torch.no_grad():
            chosen_by = sinkhorn(logits.float()) if self.training else scores
            top_indices = torch.topk(chosen_by, k=self.topk, dim=1).indices
        routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top_indices, True)
        return scores * routing_map, routing_map

    def apply_load_balancing_loss(self, probs, scores, routing_map, seq_length: int, batch: int):
        """The balance loss of ``self.routing_type``, hung on ``probs``.

        aux_loss: the switch loss over the micro-batch's tokens. They may be spread over the
        tensor-parallel ranks (sequence parallel) and the context-parallel ranks: the counts per
        expert are summed over that tp x cp group, so f_i is the micro-batch's, as in the serial
        model. seq_aux_loss (DeepSeek-V2/V3): the same loss for each sequence on its own,
        averaged over the micro-batch's sequences; [s*b, E] viewed as [s, b*E] makes each
        sequence's experts columns of their own. global_aux_loss: the counts are the global
        batch's so far (summed over tensor x data x context parallel and the micro-batches).
        """
        coeff, topk, experts = self.config.moe_aux_loss_coeff, self.topk, self.num_experts
        group = parallel_state.get_tensor_and_context_parallel_group()
        if self.routing_type == "seq_aux_loss":
            scores, routing_map = scores.reshape(seq_length, -1), routing_map.reshape(seq_length, -1)
        elif self.routing_type == "global_aux_loss":
            group = parallel_state.get_tensor_and_data_parallel_group(with_context_parallel=True)
        tokens_per_expert = routing_map.sum(dim=0).float()
        if group.size() > 1:
            torch.distributed.all_reduce(tokens_per_expert, group=group)
        total_num_tokens = scores.shape[0] * group.size()
        if self.routing_type == "global_aux_loss":
            self.global_tokens_per_expert += tokens_per_expert
            self.ga_steps += 1
            tokens_per_expert = self.global_tokens_per_expert / self.ga_steps
        aux_loss = switch_load_balancing_loss_func(scores, tokens_per_expert, total_num_tokens, topk, experts, coeff)
        if self.routing_type == "seq_aux_loss":
            aux_loss = aux_loss / batch
        save_to_aux_losses_tracker(_BALANCE_LOSS_NAMES[self.routing_type], aux_loss / coeff,
                                   self.layer_number, self._logged_layers())
        return MoEAuxLossAutoScaler.apply(probs, aux_loss)

    def apply_z_loss(self, logits):
        """With --moe-z-loss-coeff, while training: the z-loss hung on the logits. Each tp x cp
        rank's loss is a mean over its own tokens; the coefficient is divided by that group's
        size so that the ranks' gradients add up to the serial mean's."""
        if self.config.moe_z_loss_coeff is None or not (self.training and torch.is_grad_enabled()):
            return logits
        coeff = self.config.moe_z_loss_coeff / parallel_state.get_tensor_and_context_parallel_group().size()
        z_loss = z_loss_func(logits, coeff)
        save_to_aux_losses_tracker("z_loss", z_loss / coeff, self.layer_number, self._logged_layers())
        return MoEAuxLossAutoScaler.apply(logits, z_loss)

    def _logged_layers(self) -> int:
        """The MoE log's length: every decoder layer, then every multi-token-prediction layer."""
        return self.config.num_layers + (self.config.mtp_num_layers or 0)

    def reset_global_aux_loss_tracker(self) -> None:
        """After each step (finalize_model_grads): the global batch's counts start again."""
        if self.routing_type == "global_aux_loss":
            self.global_tokens_per_expert.zero_()
            self.ga_steps.zero_()

    @traced(args=lambda self, input: {"input": short_value(input), "experts": self.num_experts,
                                      "topk": self.topk, "score_function": self.score_function})
    def forward(self, input: torch.Tensor):
        self._maintain_float32_expert_bias()
        logits = self.gating(input)
        if self.config.moe_router_force_load_balancing:
            logits = apply_random_logits(logits)
        return self.routing(logits)

    def _maintain_float32_expert_bias(self) -> None:
        """Float16Module cast every floating buffer; a bias moving in steps of 1e-3 and counts
        above 256 need fp32 back (Megatron's name), before they are used, loaded or saved."""
        if self.expert_bias is not None and self.expert_bias.dtype != torch.float32:
            self.expert_bias.data = self.expert_bias.data.float()
            self.local_tokens_per_expert.data = self.local_tokens_per_expert.data.float()

    # A checkpoint loaded before the first forward would otherwise be rounded into bf16.
    def _load_from_state_dict(self, *args, **kwargs):
        self._maintain_float32_expert_bias()
        return super()._load_from_state_dict(*args, **kwargs)

    def _save_to_state_dict(self, *args, **kwargs):
        self._maintain_float32_expert_bias()
        return super()._save_to_state_dict(*args, **kwargs)
