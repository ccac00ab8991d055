"""The token dispatchers: carry each token to the rank that holds its expert, and back.

MoEAllGatherTokenDispatcher (--moe-token-dispatcher-type allgather, Megatron's default) is the
simple one. Every rank of the expert tensor x expert model group all-gathers the whole group's
tokens, with their routing maps and probabilities; each rank then runs its experts on the rows
routed to them, weights and sums the outputs per token (unpermute), and a reduce-scatter over the
same group adds up every rank's contributions and hands each rank back its own tokens. Every
message has a size fixed by the layout (all tokens, always), no counts are exchanged, and each
rank's experts see every token of the group even though only k/E of them are routed there:
cheap when the group is small, wasteful when it is large. The all-to-all below sends only the
routed rows.

MoEAlltoAllTokenDispatcher (--moe-token-dispatcher-type alltoall):

With expert parallelism (ep ranks, E experts) rank j of the expert-parallel group holds experts
[j*E/ep, (j+1)*E/ep). A token routed on rank i to an expert on rank j has to travel there:

    permute          group this rank's token copies by expert (moe_utils.permute)
    all-to-all (ep)  send the block for rank j's experts to rank j, receive theirs for mine
    [all-gather (expert tp)]  expert tensor parallel: every slice of an expert sees all its tokens
    sort by local expert      what arrived is ordered by source rank, then expert: regroup by expert
    ... the experts run ...
    the same steps backwards: unsort, [reduce-scatter (expert tp)], all-to-all (ep), unpermute

The blocks are uneven (a rank sends as many tokens to each peer as its router chose), so the
collectives are tensor_parallel's with split sizes (all_to_all, and the sequence-parallel
gather / reduce-scatter given output_split_sizes / input_split_sizes), and the sizes are
exchanged first: one all-gather of the per-expert counts over the tp x ep group.
With --moe-pad-expert-input-to-capacity every expert receives exactly its capacity from every
rank: the blocks are equal and known in advance, and that all-gather is skipped.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.tensor_parallel.mappings import (
    all_to_all, gather_from_sequence_parallel_region, reduce_scatter_to_sequence_parallel_region,
)
from minitron.core.transformer.moe.moe_utils import (
    apply_probs_on_input, get_capacity, permute, sort_chunks_by_idxs, unpermute,
)
from minitron.trace import traced
from minitron.trace.recorder import short_value


class MoEAlltoAllTokenDispatcher:
    def __init__(self, num_local_experts: int, local_expert_indices: list[int], config):
        self.config = config
        self.num_experts = config.num_moe_experts
        self.num_local_experts = num_local_experts
        self.local_expert_indices = local_expert_indices
        self.ep_group = parallel_state.get_expert_model_parallel_group()
        self.tp_group = parallel_state.get_expert_tensor_parallel_group()   # the *expert* tp group
        self.tp_ep_group = parallel_state.get_expert_tensor_and_model_parallel_group()
        self.ep_size, self.tp_size = self.ep_group.size(), self.tp_group.size()
        self.tp_rank = self.tp_group.rank()
        # What arrives is [source (tp, ep) rank][local expert]; the experts want [local expert][source].
        chunks = torch.arange(self.num_local_experts * self.tp_size * self.ep_size)  # host: read as lists
        self.sort_input_by_local_experts = chunks.reshape(-1, num_local_experts).T.ravel().tolist()
        self.restore_output_by_local_experts = chunks.reshape(num_local_experts, -1).T.ravel().tolist()

    def preprocess(self, routing_map: torch.Tensor) -> torch.Tensor:
        """Work out every block size of the exchange; return the tokens each local expert gets."""
        if self.config.moe_pad_expert_input_to_capacity:
            return self.preprocess_padded(routing_map)
        num_local_tokens_per_expert = routing_map.sum(dim=0).long()        # [E], from my tokens
        # Everyone's counts, [tp x ep ranks, E]: the group's rank is tp_rank + tp * ep_rank.
        everyone = num_local_tokens_per_expert
        if self.tp_ep_group.size() > 1:
            everyone = everyone.new_empty(self.tp_ep_group.size() * self.num_experts)
            torch.distributed.all_gather_into_tensor(everyone, num_local_tokens_per_expert,
                                                     group=self.tp_ep_group)
        # Every split size below is a Python int the collectives read on the host: one copy of
        # all the counts to the host (Megatron's one sync point per layer), not one per size.
        everyone = everyone.cpu().reshape(-1, self.num_experts)
        # [ep]: how many of my token copies go to each expert-parallel peer
        self.input_splits = everyone[self.tp_ep_group.rank()].reshape(self.ep_size, -1).sum(dim=1).tolist()
        per_rank = everyone.reshape(self.ep_size, self.tp_size, self.num_experts).transpose(0, 1)
        first, last = self.local_expert_indices[0], self.local_expert_indices[-1] + 1
        per_local_expert = per_rank[:, :, first:last]                       # [tp, ep, local experts]
        # [ep]: what my ep peers with my expert-tp rank send me; [tp]: what each tp peer then holds
        self.output_splits = per_local_expert[self.tp_rank].sum(dim=1).tolist()
        self.output_splits_tp = per_local_expert.sum(dim=(1, 2)).tolist()
        self.num_global_tokens_per_local_expert = per_local_expert.reshape(-1, self.num_local_experts)
        return per_local_expert.sum(dim=(0, 1))   # on the host, as the experts read it

    def preprocess_padded(self, routing_map: torch.Tensor) -> torch.Tensor:
        """Padded to capacity, every rank sends every expert the same number of rows, known in
        advance from the number of tokens alone: no counts to exchange, equal blocks."""
        num_tokens = routing_map.shape[0]
        capacity = min(get_capacity(num_tokens * self.config.moe_router_topk, self.num_experts,
                                    self.config.moe_expert_capacity_factor), num_tokens)
        block = capacity * self.num_local_experts
        self.input_splits = self.output_splits = [block] * self.ep_size
        self.output_splits_tp = [block * self.ep_size] * self.tp_size
        self.num_global_tokens_per_local_expert = torch.full(  # host: split sizes, as above
            (self.tp_size * self.ep_size, self.num_local_experts), capacity, dtype=torch.long)
        return torch.full((self.num_local_experts,),  # host: as the experts read it
                          capacity * self.tp_size * self.ep_size, dtype=torch.long)

    @traced(args=lambda self, hidden_states, probs, routing_map: {
        "hidden_states": short_value(hidden_states), "ep": self.ep_size, "expert_tp": self.tp_size,
        "rows_per_expert": routing_map.sum(dim=0).tolist()})
    def token_permutation(self, hidden_states, probs, routing_map):
        """[s, b, h] -> (tokens for my local experts, grouped by expert; their count per expert)."""
        self.hidden_shape = hidden_states.shape
        self.probs, self.routing_map = probs, routing_map
        hidden_states = hidden_states.reshape(-1, self.hidden_shape[-1])
        tokens_per_expert = self.preprocess(routing_map)
        permuted, self.reversed_local_input_permutation_mapping = permute(hidden_states, routing_map)
        if self.config.moe_apply_probs_on_input:
            permuted, self.probs = apply_probs_on_input(permuted, probs, routing_map)
        global_input_tokens = all_to_all(self.ep_group, permuted, self.output_splits, self.input_splits)
        if self.tp_size > 1:
            global_input_tokens = gather_from_sequence_parallel_region(
                global_input_tokens, group=self.tp_group, output_split_sizes=self.output_splits_tp)
        if self.num_local_experts > 1:
            global_input_tokens = sort_chunks_by_idxs(
                global_input_tokens, self.num_global_tokens_per_local_expert.ravel().tolist(),
                self.sort_input_by_local_experts)
        return global_input_tokens, tokens_per_expert

    @traced(args=lambda self, hidden_states: {"hidden_states": short_value(hidden_states)})
    def token_unpermutation(self, hidden_states):
        """The experts' outputs back to the tokens' home ranks, weighted and summed per token."""
        if self.num_local_experts > 1:
            hidden_states = sort_chunks_by_idxs(
                hidden_states, self.num_global_tokens_per_local_expert.T.ravel().tolist(),
                self.restore_output_by_local_experts)
        if self.tp_size > 1:
            hidden_states = reduce_scatter_to_sequence_parallel_region(
                hidden_states, group=self.tp_group, input_split_sizes=self.output_splits_tp)
        permuted = all_to_all(self.ep_group, hidden_states, self.input_splits, self.output_splits)
        output = unpermute(permuted, self.reversed_local_input_permutation_mapping, self.probs,
                           self.routing_map, restore_shape=(self.routing_map.shape[0], self.hidden_shape[-1]))
        return output.view(self.hidden_shape)


class MoEAllGatherTokenDispatcher:
    def __init__(self, num_local_experts: int, local_expert_indices: list[int], config):
        self.config = config
        self.num_local_experts = num_local_experts
        self.local_expert_indices = local_expert_indices
        self.tp_ep_group = parallel_state.get_expert_tensor_and_model_parallel_group()

    @traced(args=lambda self, hidden_states, probs, routing_map: {
        "hidden_states": short_value(hidden_states), "tp_x_ep": self.tp_ep_group.size(),
        "rows_per_expert": routing_map.sum(dim=0).tolist()})
    def token_permutation(self, hidden_states, probs, routing_map):
        """[s, b, h] -> (the group's tokens routed to my local experts, grouped by expert; their
        count per expert)."""
        self.hidden_shape = hidden_states.shape
        hidden_states = hidden_states.reshape(-1, self.hidden_shape[-1])
        if self.tp_ep_group.size() > 1:   # [T, .] -> [T x group, .], in the group's rank order
            with torch.no_grad():   # the map is the router's choice: integers, no gradient
                routing_map = gather_from_sequence_parallel_region(routing_map, group=self.tp_ep_group)
            probs = gather_from_sequence_parallel_region(probs, group=self.tp_ep_group)
            hidden_states = gather_from_sequence_parallel_region(hidden_states, group=self.tp_ep_group)
        self.gathered_shape = hidden_states.shape
        first, last = self.local_expert_indices[0], self.local_expert_indices[-1] + 1
        self.local_map = routing_map[:, first:last].contiguous()
        self.local_probs = probs[:, first:last].contiguous()
        # The experts split their rows by these counts on the host: one copy of all of them
        # (Megatron's), where reading them one by one would wait on the device once per expert.
        tokens_per_expert = self.local_map.sum(dim=0).long().cpu()
        permuted, self.reversed_local_input_permutation_mapping = permute(hidden_states, self.local_map)
        if self.config.moe_apply_probs_on_input:
            permuted, self.local_probs = apply_probs_on_input(permuted, self.local_probs, self.local_map)
        return permuted, tokens_per_expert

    @traced(args=lambda self, hidden_states: {"hidden_states": short_value(hidden_states)})
    def token_unpermutation(self, hidden_states):
        """My experts' outputs, weighted and summed per token of the whole group; the reduce-
        scatter adds every rank's part (other experts, other expert-tp slices) and keeps mine."""
        output = unpermute(hidden_states, self.reversed_local_input_permutation_mapping, self.local_probs,
                           self.local_map, restore_shape=self.gathered_shape)
        if self.tp_ep_group.size() > 1:
            output = reduce_scatter_to_sequence_parallel_region(output, group=self.tp_ep_group)
        return output.view(self.hidden_shape)
