"""MoELayer: the MLP of a transformer layer replaced by E experts, k of which see each token.

    [shared = shared_experts(x)]                       an MLP every token goes through
    probs, routing_map = router(x)                     which experts, with what weights
    tokens, counts     = dispatcher.token_permutation  to the ranks that hold those experts
    outputs            = experts(tokens, counts)       each local expert on its own rows
    y                  = dispatcher.token_unpermutation back home, weighted, summed per token
    [y = y + shared]

The layer takes and returns [s, b, h] (with sequence parallelism [s/tp, b, h], this rank's part
of the sequence: the dispatcher is built for it), and returns Megatron's (output, bias) pair
with no bias, so the transformer layer's bias-dropout-add treats it like the dense MLP.
"""

from __future__ import annotations

from minitron.core import parallel_state
from minitron.core.tensor_parallel.random import checkpoint as tensor_parallel_checkpoint
from minitron.core.transformer.module import MegatronModule
from minitron.core.transformer.moe.experts import SequentialMLP
from minitron.core.transformer.moe.experts_grouped import GroupedMLP
from minitron.core.transformer.moe.latent_projection import latent_projections
from minitron.core.transformer.moe.router import TopKRouter
from minitron.core.transformer.moe.shared_experts import SharedExpertMLP
from minitron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher, MoEAlltoAllTokenDispatcher
from minitron.trace import traced
from minitron.trace.recorder import short_value


class MoELayer(MegatronModule):
    def __init__(self, config, layer_number: int = 1):
        super().__init__(config)
        self.layer_number = layer_number
        ep_size = parallel_state.get_expert_model_parallel_world_size()
        ep_rank = parallel_state.get_expert_model_parallel_rank()
        if config.num_moe_experts % ep_size:
            raise ValueError(f"num_moe_experts {config.num_moe_experts} is not divisible by "
                             f"expert_model_parallel_size {ep_size}")
        self.num_local_experts = config.num_moe_experts // ep_size
        self.local_expert_indices = [ep_rank * self.num_local_experts + i for i in range(self.num_local_experts)]
        self.router = TopKRouter(config, layer_number)
        self.fc1_latent_proj, self.fc2_latent_proj = latent_projections(config)   # --moe-latent-size
        dispatcher = {"allgather": MoEAllGatherTokenDispatcher,
                      "alltoall": MoEAlltoAllTokenDispatcher}[config.moe_token_dispatcher_type]
        self.token_dispatcher = dispatcher(self.num_local_experts, self.local_expert_indices, config)
        experts = GroupedMLP if config.moe_grouped_gemm else SequentialMLP
        self.experts = experts(self.num_local_experts, config, layer_number, self.local_expert_indices)
        self.shared_experts = (SharedExpertMLP(config) if config.moe_shared_expert_intermediate_size
                               else None)
        # --recompute-modules shared_experts (selective): the shared MLP keeps only its input
        self.recompute_shared_experts = (config.recompute_granularity == "selective"
                                         and "shared_experts" in (config.recompute_modules or ()))

    @traced(args=lambda self, hidden_states: {"layer_number": self.layer_number,
                                              "hidden_states": short_value(hidden_states),
                                              "local_experts": self.local_expert_indices})
    def forward(self, hidden_states):
        # Megatron's check, where Megatron makes it: setup accepts these flags (minitron's
        # commands refuse a training step of them first, arguments_features.moe_training_refusal).
        if self.training and self.config.tensor_model_parallel_size > 1 and not self.config.sequence_parallel:
            raise ValueError("MoELayer trains at tensor_model_parallel_size > 1 only with sequence_parallel: "
                             "each tensor-parallel rank must route its own part of the sequence")
        # Megatron's order: the shared experts first (without overlap), then the routed ones.
        shared = None
        if self.shared_experts is not None and self.recompute_shared_experts and self.training:
            shared = tensor_parallel_checkpoint(self.shared_experts, False, hidden_states)
        elif self.shared_experts is not None:
            shared = self.shared_experts(hidden_states)
        probs, routing_map = self.router(hidden_states)
        if self.fc1_latent_proj is not None:   # routed on the h-wide token, dispatched L-wide
            hidden_states = self.fc1_latent_proj(hidden_states)
        dispatched_input, tokens_per_expert = self.token_dispatcher.token_permutation(
            hidden_states, probs, routing_map)
        expert_output, mlp_bias = self.experts(dispatched_input, tokens_per_expert)
        output = self.token_dispatcher.token_unpermutation(expert_output)
        if self.fc2_latent_proj is not None:   # back to h before the h-wide shared expert's sum
            output = self.fc2_latent_proj(output)
        if shared is not None:
            output = output + shared
        return output, mlp_bias
