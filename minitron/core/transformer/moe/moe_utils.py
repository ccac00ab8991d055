"""The pieces of an MoE layer that hold no parameters: token permutation and the load-balancing loss.

permute / unpermute
    A router sends each token to k experts. To run an expert as one matrix product, its tokens
    must sit next to each other, so the dispatcher *permutes*: the rows of the [tokens, hidden]
    input are copied out grouped by expert (expert 0's tokens, then expert 1's, ...), a token
    appearing once per expert it was sent to. ``unpermute`` is the way back: each expert output
    row is weighted by its routing probability and added into the row of the token it came from.

sort_chunks_by_idxs
    What an all-to-all delivers is grouped by the rank it came from; the dispatcher cuts it into
    (rank, expert) chunks and reorders them so that each local expert's rows sit together.

get_capacity, apply_router_token_dropping
    Optional capacity (--moe-expert-capacity-factor): an expert takes at most its share of the
    tokens times a factor; the rest are dropped. With --moe-pad-expert-input-to-capacity every
    expert gets exactly its capacity, so the dispatcher's messages have sizes known in advance.

switch_load_balancing_loss_func, MoEAuxLossAutoScaler
    Left alone, a router learns to favour a few experts and the others starve. The Switch
    Transformer's auxiliary loss, E * sum_i f_i * P_i (f_i: the fraction of routing choices that
    went to expert i, P_i: the mean probability the router gave it), is smallest when both are
    uniform. It is not added to the language-model loss the schedules see; instead the
    autoscaler hangs it on the router's output, so backward through the layer also runs
    backward from the aux loss (scaled like the main loss: 1 / micro-batches, x fp16 scale).

the aux-loss tracker
    Each MoE layer records its (unweighted) load-balancing loss per micro-batch; after the step,
    ``track_moe_metrics`` sums them over the ranks that split a micro-batch's tokens, averages
    over data-parallel replicas and layers, and returns what the iteration log prints.
"""

from __future__ import annotations

import math

import torch

from minitron.core import parallel_state
from minitron.trace import traced


def sort_chunks_by_idxs(input: torch.Tensor, split_sizes: list[int], sorted_idxs: list[int]) -> torch.Tensor:
    """Cut ``input`` into chunks of ``split_sizes`` rows and put them back in ``sorted_idxs`` order
    (the dispatcher regroups what arrived by source rank into groups by local expert)."""
    chunks = torch.split(input, split_sizes, dim=0)
    return torch.cat([chunks[i] for i in sorted_idxs], dim=0)


def get_capacity(num_tokens: int, num_experts: int, capacity_factor: float) -> int:
    """An expert's capacity: its fair share of the routing choices, times the factor, rounded up.
    ``num_tokens`` counts choices (tokens x topk) on this rank, for one micro-batch."""
    return math.ceil(num_tokens / num_experts * capacity_factor)


@traced(args=lambda probs, routing_map, topk, capacity_factor, pad_to_capacity=False: {
    "tokens": probs.shape[0], "chosen_per_expert": routing_map.sum(dim=0).tolist(),
    "capacity": get_capacity(probs.shape[0] * topk, probs.shape[1], capacity_factor), "pad": pad_to_capacity})
def apply_router_token_dropping(probs: torch.Tensor, routing_map: torch.Tensor, topk: int,
                                capacity_factor: float, pad_to_capacity: bool = False):
    """Cap each expert at its capacity; with ``pad_to_capacity`` fill it up to exactly that.

    Megatron's default drop policy, "probs": per expert (a column of ``probs``), the tokens it
    keeps are those with the largest routing probabilities; a token chosen by the router but
    beyond the capacity is dropped (its probability for that expert becomes 0, so its output
    lacks that expert's share; the residual connection still carries it). Padding keeps
    ``capacity`` rows per column whatever the router chose: the extra rows are tokens with
    probability 0, computed by the expert and weighted by nothing, so every expert's input,
    and so every all-to-all, has one fixed size. When the capacity exceeds the rank's tokens,
    nothing is dropped, and padding sends every token to every expert.
    """
    num_tokens, num_experts = probs.shape
    capacity = get_capacity(num_tokens * topk, num_experts, capacity_factor)
    if capacity >= num_tokens:
        keep = torch.ones_like(routing_map)
    else:
        _, rows = torch.topk(probs.detach(), k=capacity, dim=0, sorted=False)
        keep = torch.zeros_like(routing_map).scatter(0, rows, True)
    final_map = keep if pad_to_capacity else routing_map & keep
    return probs * final_map, final_map


def permute(tokens: torch.Tensor, routing_map: torch.Tensor):
    """[T, h] tokens, [T, E] boolean routing map -> (rows grouped by expert, their source rows).

    Transposing the map to [E, T] and reading it row by row lists, for expert 0, the tokens it
    got (in token order), then expert 1's, and so on: those token numbers are ``sorted_indices``,
    and ``index_select`` copies the rows. Dropless: every choice the router made is kept, so
    there are exactly T * k rows.
    """
    num_tokens = tokens.shape[0]
    token_ids = torch.arange(num_tokens, device=tokens.device).unsqueeze(0).expand(routing_map.shape[1], -1)
    sorted_indices = token_ids.masked_select(routing_map.T.contiguous())
    return tokens.index_select(0, sorted_indices), sorted_indices


def unpermute(permuted_tokens: torch.Tensor, sorted_indices: torch.Tensor, probs: torch.Tensor,
              routing_map: torch.Tensor, restore_shape: torch.Size) -> torch.Tensor:
    """The inverse of ``permute``, weighting each expert's output by the token's probability for it:
    out[t] = sum over the experts e that t was sent to of probs[t, e] * expert_e(x_t)."""
    weights = probs.T.contiguous().masked_select(routing_map.T.contiguous())   # same order as the rows
    weighted = permuted_tokens * weights.unsqueeze(-1).to(permuted_tokens.dtype)
    output = torch.zeros(restore_shape, dtype=permuted_tokens.dtype, device=permuted_tokens.device)
    return output.index_add(0, sorted_indices, weighted)


def switch_load_balancing_loss_func(probs: torch.Tensor, tokens_per_expert: torch.Tensor,
                                    total_num_tokens: int, topk: int, num_experts: int,
                                    moe_aux_loss_coeff: float) -> torch.Tensor:
    """coeff * E * sum_i f_i * P_i, with f_i = tokens_per_expert[i] / (T * k) and
    P_i = sum over *this rank's* tokens of probs[:, i] / T.

    ``tokens_per_expert`` and T count every token of the micro-batch, across the ranks that split
    it (sequence or context parallel); ``probs`` are this rank's rows only. Each rank's value is
    then its share of the whole, and the shares add up to the serial loss — as do their
    gradients, since only ``probs`` carries one (the counts are integers).
    """
    aggregated_probs_per_expert = probs.sum(dim=0)
    scale = num_experts * moe_aux_loss_coeff / (topk * total_num_tokens * total_num_tokens)
    return torch.sum(aggregated_probs_per_expert * tokens_per_expert) * scale


class MoEAuxLossAutoScaler(torch.autograd.Function):
    """Identity on ``output`` forward; backward also starts a backward from ``aux_loss``.

    The aux loss is born deep inside the model, far from the loss the schedule calls backward
    on. Attached here, it needs no path of its own: when the gradient reaches ``output``, the
    aux loss gets d(aux)/d(aux) = the same scale the main loss got (set per step by the
    schedule: 1 / num_microbatches, times the fp16 loss scale).
    """

    main_loss_backward_scale: torch.Tensor | None = None

    @staticmethod
    def forward(ctx, output: torch.Tensor, aux_loss: torch.Tensor):
        ctx.save_for_backward(aux_loss)
        return output

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        (aux_loss,) = ctx.saved_tensors
        scale = MoEAuxLossAutoScaler.main_loss_backward_scale
        if scale is None:
            scale = torch.tensor(1.0, device=aux_loss.device)
        return grad_output, torch.ones_like(aux_loss) * scale

    @staticmethod
    def set_loss_scale(scale: torch.Tensor) -> None:
        MoEAuxLossAutoScaler.main_loss_backward_scale = scale.detach().reshape(())


# The tracker: name -> one value per layer of the whole model, summed over this step's micro-batches.
_MOE_LAYER_WISE_LOGGING_TRACKER: dict[str, torch.Tensor] = {}


def save_to_aux_losses_tracker(name: str, loss: torch.Tensor, layer_number: int, num_layers: int) -> None:
    """Add this micro-batch's ``loss`` of layer ``layer_number`` (1-based) to the step's record."""
    values = _MOE_LAYER_WISE_LOGGING_TRACKER.get(name)
    if values is None:
        values = _MOE_LAYER_WISE_LOGGING_TRACKER[name] = torch.zeros(num_layers, device=loss.device)
    values[layer_number - 1] += loss.detach().float()


def clear_aux_losses_tracker() -> None:
    for values in _MOE_LAYER_WISE_LOGGING_TRACKER.values():
        values.zero_()


def reduce_aux_losses_tracker_across_ranks() -> None:
    """Every rank ends with the model's per-layer values: the stages' layers collected over the
    pipeline, each micro-batch's shares summed over tp x cp, the replicas averaged over dp."""
    for values in _MOE_LAYER_WISE_LOGGING_TRACKER.values():
        torch.distributed.all_reduce(values, group=parallel_state.get_pipeline_model_parallel_group())
        torch.distributed.all_reduce(values, group=parallel_state.get_tensor_and_context_parallel_group())
        torch.distributed.all_reduce(values, group=parallel_state.get_data_parallel_group())
        values /= parallel_state.get_data_parallel_world_size()


def track_moe_metrics(loss_scale: float, num_moe_layers: int, num_layers: int) -> dict[str, float]:
    """After a step: {'load_balancing_loss': its mean over micro-batches and MoE layers}.

    Collective over the whole world (every rank calls it, with the same model): a stage
    without MoE layers still joins the pipeline all-reduce, with zeros.
    """
    if not _MOE_LAYER_WISE_LOGGING_TRACKER:   # this stage has no MoE layer: join with zeros
        device = "cuda" if torch.distributed.get_backend() == "nccl" else "cpu"
        _MOE_LAYER_WISE_LOGGING_TRACKER["load_balancing_loss"] = torch.zeros(num_layers, device=device)
    reduce_aux_losses_tracker_across_ranks()
    metrics = {name: (values.sum() * loss_scale / num_moe_layers).item()
               for name, values in _MOE_LAYER_WISE_LOGGING_TRACKER.items()}
    clear_aux_losses_tracker()
    return metrics
