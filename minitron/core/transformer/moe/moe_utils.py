"""The pieces of an MoE layer that hold no parameters: token permutation and the load-balancing loss.

permute / unpermute (apply_probs_on_input)
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
    tokens times a factor; the rest are dropped (the least probable, or by position). With
    --moe-pad-expert-input-to-capacity every expert gets exactly its capacity, so the
    dispatcher's messages have sizes known in advance.

switch_load_balancing_loss_func, MoEAuxLossAutoScaler
    Left alone, a router learns to favour a few experts and the others starve. The Switch
    Transformer's auxiliary loss, E * sum_i f_i * P_i (f_i: the fraction of routing choices that
    went to expert i, P_i: the mean probability the router gave it), is smallest when both are
    uniform. It is not added to the language-model loss the schedules see; instead the
    autoscaler hangs it on the router's output, so backward through the layer also runs
    backward from the aux loss (scaled like the main loss: 1 / micro-batches, x fp16 scale).

topk_routing_with_score_function, group_limited_topk, compute_routing_scores_for_aux_loss
    The router's scores (softmax or sigmoid), its top-k choice (optionally on scores plus the
    aux-loss-free expert bias, optionally inside a few groups of experts), and the weights of
    the chosen experts.

z_loss_func
    The z-loss keeps the router's logits small.

(Balancing without a loss, re-exported here under Megatron's names: Sinkhorn, forced balance
with random logits, the aux-loss-free expert bias's step, is load_balancing.py.)

get_align_size_for_quantization, pad_rows
    Under fp8 each expert's rows are padded with zero rows to a multiple of 16 (mxfp8: 32), as
    the fp8 grouped GEMM needs them (experts.py says why the padding changes no number).

(The per-layer record of these losses, what the iteration log prints, is moe_logging.py.)
"""

from __future__ import annotations

import math

import torch

# MoEAuxLossAutoScaler: Megatron's name here; it sits beside the schedule, which sets its scale.
from minitron.core.pipeline_parallel.loss_autoscalers import MoEAuxLossAutoScaler  # noqa: F401
from minitron.core.transformer.moe.load_balancing import (  # noqa: F401  (re-exported: Megatron's names)
    apply_random_logits, finish_router_step, get_updated_expert_bias, sinkhorn, update_router_expert_bias,
)
from minitron.trace import traced


def sort_chunks_by_idxs(input: torch.Tensor, split_sizes: list[int], sorted_idxs: list[int]) -> torch.Tensor:
    """Cut ``input`` into chunks of ``split_sizes`` rows and put them back in ``sorted_idxs`` order
    (the dispatcher regroups what arrived by source rank into groups by local expert)."""
    chunks = torch.split(input, split_sizes, dim=0)
    return torch.cat([chunks[i] for i in sorted_idxs], dim=0)


def get_align_size_for_quantization(config) -> int:
    """Under fp8 an expert's GEMMs take its rows in whole multiples of 16 (32 under mxfp8, whose
    weight-gradient GEMM blocks them along the rows): Megatron pads every expert's rows with
    zeros up to that (TE's Fp8Padding); 0 without fp8: no padding."""
    if not getattr(config, "fp8", None):
        return 0
    return 32 if config.fp8_recipe == "mxfp8" else 16


def pad_rows(x: torch.Tensor, align: int) -> torch.Tensor:
    """x with zero rows appended up to a multiple of ``align`` rows (none when it is one)."""
    extra = -x.size(0) % align
    return torch.cat([x, x.new_zeros(extra, *x.shape[1:])]) if extra else x


def get_capacity(num_tokens: int, num_experts: int, capacity_factor: float) -> int:
    """An expert's capacity: its fair share of the routing choices, times the factor, rounded up.
    ``num_tokens`` counts choices (tokens x topk) on this rank, for one micro-batch."""
    return math.ceil(num_tokens / num_experts * capacity_factor)


@traced(args=lambda probs, routing_map, topk, capacity_factor, pad_to_capacity=False, drop_policy="probs": {
    "tokens": probs.shape[0], "chosen_per_expert": routing_map.sum(dim=0).tolist(),
    "capacity": get_capacity(probs.shape[0] * topk, probs.shape[1], capacity_factor), "pad": pad_to_capacity,
    "drop_policy": drop_policy})
def apply_router_token_dropping(probs: torch.Tensor, routing_map: torch.Tensor, topk: int,
                                capacity_factor: float, pad_to_capacity: bool = False,
                                drop_policy: str = "probs"):
    """Cap each expert at its capacity; with ``pad_to_capacity`` fill it up to exactly that.

    Per expert (a column), the tokens it keeps are, with Megatron's default drop policy
    "probs", those with the largest routing probabilities; with "position", ``capacity`` of the
    tokens that chose it, whatever their probabilities: the column's top-k of the 0/1 map, as
    Megatron computes it. (Megatron's help says the last tokens are dropped; which of the equal
    ones torch.topk keeps is its own choice, on the CPU not always the first.) A token chosen
    by the router but beyond the capacity is dropped (its probability for that expert becomes
    0, so its output lacks that expert's share; the residual connection still carries it). Padding keeps ``capacity`` rows per
    column whatever the router chose: the extra rows are tokens with probability 0, computed by
    the expert and weighted by nothing, so every expert's input, and so every all-to-all, has
    one fixed size. When the capacity exceeds the rank's tokens, nothing is dropped, and
    padding sends every token to every expert.
    """
    num_tokens, num_experts = probs.shape
    capacity = get_capacity(num_tokens * topk, num_experts, capacity_factor)
    if capacity >= num_tokens:
        keep = torch.ones_like(routing_map)
    else:
        ranked = probs.detach() if drop_policy == "probs" else routing_map.int()
        _, rows = torch.topk(ranked, k=capacity, dim=0, sorted=False)
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


def apply_probs_on_input(permuted_tokens: torch.Tensor, probs: torch.Tensor, routing_map: torch.Tensor):
    """--moe-apply-probs-on-input (Llama 4): each permuted row is scaled by its routing weight
    *before* its expert, and comes back unweighted. Returns the scaled rows and the weights
    unpermute should then use: 1 on every routed entry. With one expert per token (top-1, the
    only case Megatron allows) the expert sees p * x instead of x: its nonlinearity makes the
    output differ from p * expert(x), and the router's gradient flows through the expert.
    Megatron scales the rows where they arrive, in the experts; scaling them where they leave
    gives the same numbers (a row and its weight travel together) and keeps the experts' code one."""
    weights = probs.T.contiguous().masked_select(routing_map.T.contiguous())   # the rows' order
    weighted = (permuted_tokens * weights.unsqueeze(-1)).to(permuted_tokens.dtype)
    return weighted, routing_map.to(probs.dtype)


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


def group_limited_topk(scores: torch.Tensor, topk: int, num_tokens: int, num_experts: int, num_groups: int,
                       group_topk: int):
    """The top-k of ``scores`` [T, E], taken only inside each token's ``group_topk`` best groups.

    The E experts are cut into ``num_groups`` groups of consecutive experts (with E/ep experts
    per rank, a group per rank or per node: DeepSeek-V2 limits a token to 3 devices, DeepSeek-V3
    to 4 nodes, so its all-to-all reaches few peers). A group's score is the sum of its best
    topk / group_topk expert scores; a token keeps its best ``group_topk`` groups, and the
    experts of the others get -inf, so the final top-k cannot pick them.
    """
    grouped = scores.view(num_tokens, num_groups, -1)
    group_scores = grouped.topk(topk // group_topk, dim=-1).values.sum(dim=-1)     # [T, groups]
    best_groups = group_scores.topk(group_topk, dim=-1, sorted=False).indices
    group_mask = torch.zeros_like(group_scores).scatter(1, best_groups, 1).bool()
    expert_mask = group_mask.unsqueeze(-1).expand(grouped.shape).reshape(num_tokens, num_experts)
    return scores.masked_fill(~expert_mask, float("-inf")).topk(topk, dim=-1)


def topk_routing_with_score_function(logits: torch.Tensor, topk: int, use_pre_softmax: bool = False,
                                     num_groups: int | None = None, group_topk: int | None = None,
                                     scaling_factor: float | None = None, score_function: str = "softmax",
                                     expert_bias: torch.Tensor | None = None):
    """logits [T, E] -> (probs [T, E], zero off the chosen experts; routing_map [T, E] bool).

    softmax, Megatron's default order: pick the k largest *logits*, then a softmax over just
    those k, so a token's weights sum to one. With ``use_pre_softmax`` the softmax runs over
    all E first and the k chosen keep their (smaller) shares of it.
    sigmoid (DeepSeek-V3): each expert's score is sigmoid(logit), independent of the others;
    the k largest are chosen and, for k > 1, divided by their sum. The expert bias of
    aux-loss-free balancing is added to the scores for the *choice* only: the weights come
    from the unbiased scores, so the bias steers traffic without entering the gradient.
    With ``group_topk`` every top-k above is group_limited_topk's (on the logits, the softmax
    scores or the biased sigmoids, whichever the choice is made on).
    ``scaling_factor`` then multiplies the weights (a top-k with weights summing to one would
    otherwise shrink the layer's output as k grows). Scores are fp32; probs leave in logits' dtype.
    """
    def choose(scores):   # -> (the k values, their experts)
        if group_topk:
            return group_limited_topk(scores, topk, *logits.shape, num_groups, group_topk)
        return torch.topk(scores, k=topk, dim=1)

    if score_function == "softmax":
        if use_pre_softmax:
            probs, top_indices = choose(torch.softmax(logits, dim=-1, dtype=torch.float32))
        else:
            top_logits, top_indices = choose(logits)
            probs = torch.softmax(top_logits, dim=-1, dtype=torch.float32)
    else:   # sigmoid
        scores = torch.sigmoid(logits.float())
        _, top_indices = choose(scores if expert_bias is None else scores + expert_bias.float())
        probs = torch.gather(scores, 1, top_indices)
        # 1e-20: Megatron's guard against a sum of zero
        probs = probs / (probs.sum(dim=-1, keepdim=True) + 1e-20) if topk > 1 else probs
    if scaling_factor:
        probs = probs * scaling_factor
    probs = probs.type_as(logits)
    routing_probs = torch.zeros_like(logits).scatter(1, top_indices, probs)
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top_indices, True)
    return routing_probs, routing_map


def compute_routing_scores_for_aux_loss(logits: torch.Tensor, topk: int, score_function: str):
    """What the balance losses judge: every expert's score (the softmax over all E, or the
    sigmoids normalised to sum to one) and the top-k of those scores, without the expert bias,
    before any capacity drop."""
    if score_function == "softmax":
        scores = torch.softmax(logits, dim=-1, dtype=torch.float32)
    else:
        scores = torch.sigmoid(logits.float())
        scores = scores / (scores.sum(dim=-1, keepdim=True) + 1e-20)
    _, top_indices = torch.topk(scores, k=topk, dim=1)
    routing_map = torch.zeros_like(logits, dtype=torch.bool).scatter(1, top_indices, True)
    return routing_map, scores


def z_loss_func(logits: torch.Tensor, z_loss_coeff: float) -> torch.Tensor:
    """ST-MoE's z-loss, coeff * mean over tokens of logsumexp(logits)^2: large logits make the
    softmax brittle (and overflow in low precision); this pulls them towards zero."""
    return torch.mean(torch.square(torch.logsumexp(logits, dim=-1))) * z_loss_coeff
