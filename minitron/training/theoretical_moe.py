"""What the experts add to a rank's cost: the estimate's mixture-of-experts terms.

The parameters are the easy part (theoretical_params.moe_mlp_params: the router, the shared
expert, and E/ep experts cut by expert tp, with their biases when expert tp is 1). The experts
live in a gradient buffer of their own, reduced and, with the distributed optimizer, sharded
over the *expert*-data-parallel group: the ranks that hold the same experts, world / (expert
tp x ep x pp) of them.

The traffic is the hard part only for the all-to-all dispatcher. The all-gather one (Megatron's
default) gathers every token of the expert tp x ep group and reduce-scatters the outputs back:
sizes fixed by the layout, exact. The all-to-all, per MoE layer and micro-batch, hands over ep
the rows this rank sends to the experts, and in the combine the rows it received; backward
sends both back. How many rows an expert receives is the router's choice, known only when the
step runs. Two cases:

* ``--moe-expert-capacity-factor F --moe-pad-expert-input-to-capacity``: every expert gets
  exactly ``capacity = ceil(F x T x k / E)`` rows from each rank (T: the rank's tokens in a
  micro-batch, k: top-k; at most T), so every message has a size known in advance, and the
  estimate is exact;
* otherwise the estimate is the balanced-routing *expectation*, T x k / E rows per expert
  (capped at the capacity when there is one). A real router is never perfectly balanced:
  ``minitron estimate`` labels those numbers as expectations and ``--check`` shows the deviation.
  (Dropless, what leaves a rank in the dispatch is exact, T x k rows; only what arrives varies.)
"""

from __future__ import annotations

import math

from minitron.training.theoretical_params import (
    DTYPE_BYTES, _flag, chunk_layers, is_moe_layer, recomputed_layers,
)


def has_experts(args) -> bool:
    return bool(_flag(args, "num_experts"))


def padded(args) -> bool:
    """Every all-to-all has a size fixed in advance: the estimate is exact, not an expectation."""
    return bool(_flag(args, "moe_pad_expert_input_to_capacity"))


def routed_width(args) -> int:
    """The width of a dispatched row: --moe-latent-size L when given (moe/latent_projection.py), else h."""
    return _flag(args, "moe_latent_size") or args.hidden_size


def all_gather(args) -> bool:
    """The all-gather dispatcher (Megatron's default): its messages carry every token, always."""
    return _flag(args, "moe_token_dispatcher_type", "allgather") == "allgather"


def expectation_keys(args) -> set[str]:
    """Group keys whose bytes follow the routing (empty when padded to capacity, or with the
    all-gather dispatcher, whose message sizes the layout alone fixes)."""
    if not has_experts(args) or padded(args) or all_gather(args):
        return set()
    keys = {"ep"} if args.expert_model_parallel_size > 1 else set()
    return keys | ({"expt-tp"} if args.expert_tensor_parallel_size > 1 else set())


def expert_data_parallel_size(args) -> int:
    return args.world_size // (args.expert_tensor_parallel_size * args.expert_model_parallel_size
                               * args.pipeline_model_parallel_size)


def local_tokens(args) -> int:
    """T: the tokens a rank routes per micro-batch (its part of the sequence with sp and cp)."""
    t = args.tensor_model_parallel_size
    s = args.seq_length // args.context_parallel_size
    return (s // t if args.sequence_parallel and t > 1 else s) * args.micro_batch_size


def rows_per_expert(args) -> float:
    """Rows one expert receives from one rank per micro-batch: the capacity when padded, else
    the balanced expectation T x k / E (no more than the capacity when there is one)."""
    tokens, k, e = local_tokens(args), args.moe_router_topk, args.num_experts
    factor = _flag(args, "moe_expert_capacity_factor")
    capacity = None if factor is None else min(math.ceil(tokens * k / e * factor), tokens)
    if padded(args):
        return capacity
    fair = tokens * k / e
    return fair if capacity is None else min(fair, capacity)


def expert_rows(args) -> tuple[float, int, int]:
    """(rows one local expert computes per micro-batch: what arrived from the ep sources,
    gathered over expert tp; those rows padded as fp8 pads them, moe_utils'
    get_align_size_for_quantization; the local experts)."""
    arrived = rows_per_expert(args) * args.expert_model_parallel_size * args.expert_tensor_parallel_size
    align = (32 if args.fp8_recipe == "mxfp8" else 16) if _flag(args, "fp8") else 1
    return arrived, math.ceil(arrived / align) * align, args.num_experts // args.expert_model_parallel_size


def moe_layers(args, layers) -> int:
    return sum(1 for layer in layers if is_moe_layer(args, layer))


def moe_traffic(args, pp_rank: int, chunk: int, tally, times: int) -> None:
    """One forward and backward of a chunk's MoE layers, ``times`` micro-batches. (Their
    attention's tensor-parallel mappings are theoretical_comm's; the MLP makes none of its own:
    its experts are cut by expert tp instead.)"""
    layers = chunk_layers(args, pp_rank, chunk)
    n = moe_layers(args, layers)
    if not n:
        return
    # Recomputed layers run their router's and dispatcher's collectives a second time.
    again = moe_layers(args, layers[:recomputed_layers(args, len(layers))])
    e, h, experts = DTYPE_BYTES[args.params_dtype], routed_width(args), args.num_experts
    forwards = n + again
    # The router's load-balancing loss: expert counts summed over the ranks sharing a micro-batch.
    if args.moe_aux_loss_coeff > 0 and args.tensor_model_parallel_size * args.context_parallel_size > 1:
        tally.add("tp-cp", experts * 4, times * forwards)
    ep, etp = args.expert_model_parallel_size, args.expert_tensor_parallel_size
    if all_gather(args):
        _all_gather_traffic(args, tally, times * forwards, times * n)
        return
    if not padded(args) and ep * etp > 1:   # the dispatcher's exchange of counts (int64)
        tally.add("tp-ep", experts * 8, times * forwards)
    # Rows this rank sends to all E experts, and (balanced: as many) receives for its own.
    rows = round(rows_per_expert(args) * experts)
    if ep > 1:   # dispatch and combine forward, their gradients backward
        tally.add("ep", rows * h * e, times * 2 * (forwards + n))
    if etp > 1:   # gather to the expert-tp slices, reduce-scatter back (and the reverse backward)
        tally.add("expt-tp", rows * h * e, times * (forwards + n))
        tally.add("expt-tp", rows * etp * h * e, times * (forwards + n))


def _all_gather_traffic(args, tally, forwards: int, backwards: int) -> None:
    """The all-gather dispatcher over the expert tp x ep group (G ranks), per layer and pass.
    Forward: the routing map (bool), probs and tokens gathered ([T, E], [T, E], [T, h] each
    rank), the outputs reduce-scattered ([T x G, h]). Backward: the probs' and tokens'
    gradients reduce-scattered ([T x G, .]), the outputs' all-gathered ([T, h]); the map has none."""
    group = args.expert_model_parallel_size * args.expert_tensor_parallel_size
    if group == 1:
        return
    e, h, experts, tokens = DTYPE_BYTES[args.params_dtype], routed_width(args), args.num_experts, local_tokens(args)
    p = {"fp32": 4, "fp64": 8}.get(_flag(args, "moe_router_dtype"), e)   # probs: the router's dtype
    tally.add("tp-ep", tokens * experts, forwards)                            # the map
    tally.add("tp-ep", tokens * experts * p, forwards)                        # probs
    tally.add("tp-ep", tokens * h * e, forwards)                              # tokens
    tally.add("tp-ep", tokens * group * h * e, forwards)                      # outputs
    tally.add("tp-ep", tokens * group * experts * p, backwards)               # probs' gradient
    tally.add("tp-ep", tokens * group * h * e, backwards)                     # tokens' gradient
    tally.add("tp-ep", tokens * h * e, backwards)                             # outputs' gradient


def step_traffic(args, tally) -> None:
    """Once per step: the optimizer's expert statistics and the load-balancing loss's report."""
    if not has_experts(args):
        return
    if not args.use_distributed_optimizer:
        # Expert gradients are split over expert tp x ep x pp: norms and the inf check are
        # summed over that group too, when it is not the tp x pp group.
        etp, ep, tp = args.expert_tensor_parallel_size, args.expert_model_parallel_size, args.tensor_model_parallel_size
        if etp * ep != tp:
            mixed = args.fp16 or args.bf16
            if mixed and (args.fp16 or args.loss_scale is not None):
                tally.add("tp-ep-pp", 4)
            if args.clip_grad > 0:
                tally.add("tp-ep-pp", 4)
    if args.moe_aux_loss_coeff > 0:   # track_moe_metrics: one value per layer, over pp, tp x cp, dp
        for key in ("pp", "tp-cp", "dp"):
            tally.add(key, args.num_layers * 4)


def is_expert_buffer(plist) -> bool:
    return bool(plist) and plist[0].expert


def expert_key(plist, dense_key: str) -> str:
    """The group a buffer is reduced over: expt-dp for the experts' buffer, else the dense one's."""
    return "expt-dp" if is_expert_buffer(plist) else dense_key


def shards(args, plist, dense_dp: int) -> int:
    """How many ways the distributed optimizer splits this buffer."""
    return expert_data_parallel_size(args) if is_expert_buffer(plist) else dense_dp


def split_buffers(args, plist, layout):
    """A model chunk's parameters as DDP buffers them: [(dense, layout)] and, with experts,
    (experts, their layout over the expert-data-parallel group). ``layout(params, dp)``:
    theoretical_memory_usage.buffer_layout for this run."""
    dense = [p for p in plist if not p.expert]
    dp = args.data_parallel_size * args.context_parallel_size
    out = [(dense, layout(dense, dp))]
    experts = [p for p in plist if p.expert]
    if experts:
        out.append((experts, layout(experts, expert_data_parallel_size(args))))
    return out


def activation_delta(args, pp_rank: int, chunk: int) -> int:
    """Bytes an MoE layer saves for backward beyond (or short of) the dense MLP it replaces,
    times the chunk's MoE layers whose activations are kept (not under full recomputation).

    What this code saves, per micro-batch: the router its input (T rows, this rank's tokens),
    top-k's indices and the softmax over the chosen k (fp32), with the balance loss the full
    softmax (fp32, [T, E]), with a capacity the keep mask; permute its row indices (int64);
    the experts each fc1 input, GeLU input and fc2 input (N rows: what arrived from every
    source, gathered over expert tp; gated, fc1's [gate | up], silu(gate) and fc2's input:
    four ffn-wide tensors instead of two, as the dense MLP's); unpermute the routing mask, the
    combined rows and their weights. The dense MLP's fc1 input (the whole sequence under sp)
    and its two (gated: four) [s, b, ffn/t] tensors are not there."""
    layers = chunk_layers(args, pp_rank, chunk)
    layers = layers[recomputed_layers(args, len(layers)):]   # a checkpointed layer keeps none
    n = moe_layers(args, layers)
    if not n:
        return 0
    e, h, k, experts = DTYPE_BYTES[args.params_dtype], args.hidden_size, args.moe_router_topk, args.num_experts
    x = routed_width(args)   # the width of what is dispatched (rows below are x wide)
    tokens, etp = local_tokens(args), args.expert_tensor_parallel_size
    sent = round(rows_per_expert(args) * experts)          # rows this rank dispatches
    arrived = sent * etp                                   # rows its expert slices compute
    gathered = tokens * etp * args.expert_model_parallel_size if all_gather(args) else tokens
    ffn = args.moe_ffn_hidden_size // etp
    saved = 4 if _flag(args, "swiglu", False) else 2      # ffn-wide tensors an MLP keeps
    moe = tokens * h * e + tokens * k * (8 + 4)            # router: input; top-k indices, softmax
    if args.moe_aux_loss_coeff > 0:
        moe += tokens * experts * 4 + experts * 4 + 4      # full softmax, counts, the loss
    if _flag(args, "moe_expert_capacity_factor") is not None:
        moe += tokens * experts                            # the keep mask (bool)
    if all_gather(args):   # permute and unpermute run on the expert side, over the gathered tokens
        local = experts // args.expert_model_parallel_size
        moe += arrived * 8 + arrived * (x + saved * ffn) * e   # permute's indices; the experts
        moe += gathered * local + arrived * x * e + arrived * e   # unpermute: mask, rows, weights
    else:
        moe += sent * 8 + arrived * (x + saved * ffn) * e  # permute's indices; the experts
        moe += tokens * experts + sent * x * e + sent * e  # unpermute: mask, rows, weights
    if x != h:   # fc2_latent_proj keeps its input (fc1_latent_proj's is the router's, counted)
        moe += tokens * x * e
    t = args.tensor_model_parallel_size
    s = args.seq_length // args.context_parallel_size
    dense = s * args.micro_batch_size * (h + saved * args.ffn_hidden_size // t) * e
    shared = _flag(args, "moe_shared_expert_intermediate_size")
    if shared:   # the shared expert saves what a dense MLP of its width saves
        moe += s * args.micro_batch_size * (h + saved * shared // t) * e
    return n * (moe - dense)
