"""The bytes each rank hands to communication in one training iteration, by group kind.

What train_step does, call by call, without running it: per micro-batch, the batch broadcast
over the tensor-parallel group (get_batch_on_this_tp_rank), the tensor-parallel mappings of
every layer forward and backward (tensor_parallel/mappings.py), the cross entropy's three
all-reduces, and the activations and gradients sent to the neighbouring stages; once per step,
the reported loss (train_step's reduce_losses), the data-parallel reduction of every gradient bucket, the
sequence-parallel norms, the tied embedding, the optimizer's statistics and, with the
distributed optimizer, the all-gather of the updated shards. "Bytes handed" is the tensor a
rank passes to the collective (its own shard for a gather); point to point, the bytes sent.
Keys are `minitron groups --json`'s. Context parallelism adds its ring (key cp) and expert
parallelism its all-to-alls (key ep) here, beside the calls they change.
"""

from __future__ import annotations

from minitron.training.theoretical_params import (
    DTYPE_BYTES, chunk_ends, chunk_layers, chunks_of, is_moe_layer, num_microbatches, query_groups, recomputed_layers,
)
from minitron.core.rank_generator import HIERARCHICAL_CP_DESC
from minitron.training.theoretical_zero import zero_comm
from minitron.training.theoretical_zero_r import zero_r_gathers
from minitron.training.theoretical_fsdp import fsdp_comm
from minitron.training.theoretical_torch_fsdp2 import torch_fsdp2_comm
from minitron.training.theoretical_moe import expert_key, moe_traffic, shards, step_traffic


class _Tally(dict):
    """group key -> [bytes, calls]."""

    def add(self, key: str, nbytes: int, calls: int = 1) -> None:
        if calls:
            entry = self.setdefault(key, [0, 0])
            entry[0] += nbytes * calls
            entry[1] += calls


def _batch_broadcasts(args, first: bool, last: bool, tally: _Tally, times: int) -> None:
    """get_batch_on_this_tp_rank: per dtype, one broadcast of the shapes (5 int64 per key),
    one of the flattened tensors, over the tensor-parallel group (even a group of one)."""
    b, s = args.micro_batch_size, args.seq_length
    int64 = (2 if first else 0) + (1 if last else 0)
    groups = [(int64, b * s * 8)] if int64 else []
    if last:
        groups.append((1, b * s * 4))                        # loss mask, float32
    if (first or last) and args.create_attention_mask_in_dataloader:
        groups.append((1, b * s * s))                        # attention mask, bool
    for keys, per_key in groups:
        tally.add("tp", 5 * keys * 8, times)
        tally.add("tp", keys * per_key, times)


def _linear_pairs(args, layers) -> int:
    """Column-then-row linear pairs in these layers: attention's qkv -> proj in each, and the
    MLP's fc1 -> fc2 where the MLP is dense (an MoE layer's experts are cut by expert tp, and
    their traffic is theoretical_moe's; its shared expert, if any, is a dense MLP's pair)."""
    shared = 2 if getattr(args, "moe_shared_expert_intermediate_size", None) else 1
    if getattr(args, "hybrid_layer_pattern", None):   # each hybrid layer is one half: one pair (M: in/out_proj)
        return sum(shared - 1 if is_moe_layer(args, layer) else 1 for layer in layers)
    return sum(shared if is_moe_layer(args, layer) else 2 for layer in layers)


def _tp_traffic(args, pre: bool, post: bool, chunk: range, tally: _Tally, times: int) -> None:
    """The tensor-parallel mappings of one forward and backward of a chunk's layers (a group of
    one skips them all)."""
    t = args.tensor_model_parallel_size
    if t == 1:
        return
    pairs = _linear_pairs(args, chunk)
    again = _linear_pairs(args, chunk[:recomputed_layers(args, len(chunk))])   # forward again
    e, b, h = DTYPE_BYTES[args.params_dtype], args.micro_batch_size, args.hidden_size
    s = args.seq_length // args.context_parallel_size
    whole = s * b * h * e
    if args.sequence_parallel:
        # Each column-parallel input: all-gather forward (hands its s/t rows); in backward the
        # linear gathers its rows again (it kept only those) and reduce-scatters the input
        # gradient (hands the whole); each row-parallel output: the reverse.
        columns = pairs + (1 if post else 0)                                     # qkv, fc1, output
        tally.add("tp", whole // t, times * columns)                             # gathers in forward
        tally.add("tp", whole // t, times * columns)                             # again in backward
        tally.add("tp", whole, times * columns)                                  # their backward
        tally.add("tp", whole, times * pairs)                                    # reduce-scatters
        tally.add("tp", whole // t, times * (pairs + (1 if pre else 0)))         # their backward
    else:
        tally.add("tp", whole, times * 2 * pairs)         # proj, fc2 forward; qkv, fc1 backward
        tally.add("tp", whole, times * (1 if post else 0))   # output layer input, backward
    g = query_groups(args)
    if g < t:   # fewer kv groups than ranks: linear_qkv's output all-gathered, reduce-scattered back
        qkv = s * b * (args.num_attention_heads + 2 * g) * args.kv_channels * e
        if getattr(args, "hybrid_layer_pattern", None):   # only the pattern's attention layers have one
            chunk = [i for i in chunk if args.hybrid_layer_pattern.replace("|", "")[i] == "*"]
        tally.add("tp", qkv // t, times * (len(chunk) + recomputed_layers(args, len(chunk))))   # forward
        tally.add("tp", qkv, times * len(chunk))                                            # backward
    if args.sequence_parallel:                             # full recomputation: forward again
        tally.add("tp", whole // t, times * again)
        tally.add("tp", whole, times * again)
    else:
        tally.add("tp", whole, times * again)
    if pre:
        tally.add("tp", whole, times)                     # the embedding's all-reduce
    if post:
        tally.add("tp", s * b * 4, times * 3)             # cross entropy: max, target logit, sum exp


def _cp_ring(args, chunk, again: int, tally: _Tally, times: int) -> None:
    """Context parallelism's attention, per layer of the chunk, by its --cp-comm-type.

    p2p, the ring (context_parallel.py): forward passes this rank's keys and values on cp - 1
    times; backward passes them on cp - 1 times more and their gradient cp times. One message:
    [2, b, heads/t, s/cp, d] in fp32, keys repeated per head.
    a2a (context_parallel_a2a.py): forward hands q, k, v and then the output to one all-to-all
    each, backward their gradients, each [b, heads/t, s/cp, d] in the model's dtype.
    a2a+p2p: those all-to-alls in the first level's groups, then the ring over the second's."""
    cp = args.context_parallel_size
    if cp == 1:
        return
    kinds = args.cp_comm_type if isinstance(args.cp_comm_type, list) else [args.cp_comm_type]
    local = args.micro_batch_size * args.num_attention_heads // args.tensor_model_parallel_size \
        * (args.seq_length // cp) * args.kv_channels
    selective = getattr(args, "recompute_granularity", None) == "selective"
    for index, layer in enumerate(chunk):
        kind = kinds[layer % len(kinds)]                        # one for all, or one per layer
        forwards = (2 if selective else 1) + (1 if index < again else 0)   # recomputed attention too
        ring, key = cp, "cp"
        if kind in ("a2a", "a2a+p2p"):
            key = "cp" if kind == "a2a" else HIERARCHICAL_CP_DESC   # a2a+p2p: its sub-groups, both levels
            tally.add(key, local * DTYPE_BYTES[args.params_dtype], times * 4 * (forwards + 1))
            ring = args.hierarchical_context_parallel_sizes[1] if kind == "a2a+p2p" else 1
        if ring > 1:   # the same message size after a2a+p2p's all-to-all: heads/A of A times the tokens
            tally.add(key, 2 * local * 4, times * (forwards * (ring - 1) + (2 * ring - 1)))



def comm_bytes(args, pp_rank: int, stage: list) -> _Tally:
    """Every collective and send of one train_step on a rank of pipeline stage ``pp_rank``
    (``stage``: theoretical_memory_usage.stage_buffers' answer: each chunk's parameters and
    gradient-buffer layout, which the data-parallel reduction follows bucket by bucket)."""
    tally = _Tally()
    m, pp = num_microbatches(args), args.pipeline_model_parallel_size
    e, b, h = DTYPE_BYTES[args.params_dtype], args.micro_batch_size, args.hidden_size
    t, s = args.tensor_model_parallel_size, args.seq_length // args.context_parallel_size
    grad_e = 4 if args.accumulate_allreduce_grads_in_fp32 else e
    dist_opt = args.use_distributed_optimizer
    dp = args.data_parallel_size * args.context_parallel_size
    p2p = (s // t if args.sequence_parallel and t > 1 else s) * b * h * e
    chunks = list(chunks_of(args))
    for chunk in chunks:
        pre, post = chunk_ends(args, pp_rank, chunk)
        _batch_broadcasts(args, pre, post, tally, m)
        layers = len(chunk_layers(args, pp_rank, chunk))
        _tp_traffic(args, pre, post, chunk_layers(args, pp_rank, chunk), tally, m)
        moe_traffic(args, pp_rank, chunk, tally, m)              # experts: ep, expt-tp, tp-ep
        _cp_ring(args, chunk_layers(args, pp_rank, chunk), recomputed_layers(args, layers), tally, m)
        if pp > 1:
            tally.add("pp", p2p, m * (0 if post else 1))       # activation forward
            tally.add("pp", p2p, m * (0 if pre else 1))        # its gradient backward
    if getattr(args, "deepspeed", False):   # DeepSpeed's engine reduces and steps instead
        zero_r_gathers(args, tally, m)       # ZeRO-R's partitioned checkpoints, gathered in backward
        zero_comm(args, stage[0][0], tally)
        return tally
    if getattr(args, "use_megatron_fsdp", False):   # Megatron-FSDP's units reduce and gather instead
        fsdp_comm(args, tally, pp_rank)
        return tally
    if getattr(args, "use_torch_fsdp2", False):   # torch's FSDP2 gathers and reduces every unit
        torch_fsdp2_comm(args, tally)
        return tally
    # finalize_model_grads: the data-parallel reduction of every bucket of every chunk, ...
    sp_grads = 0
    for plist, (buckets, _) in stage:
        for start, end in buckets:   # experts' buffers: over the expert-data-parallel group
            tally.add(expert_key(plist, "dp-cp"), (end - start) * grad_e)   # all-reduce or reduce-scatter
        sp_grads += sum(p.numel for p in plist if p.sequence_parallel)
    if sp_grads:                                               # ... the sequence-parallel norms ...
        tally.add("tp", sp_grads * grad_e)
    tied = not args.untie_embeddings_and_output_weights
    if pp > 1 and tied and pp_rank in (0, pp - 1):             # ... and the tied embedding
        tally.add("embd", args.padded_vocab_size // t * h * grad_e)
    # optimizer.step: the overflow check (with a loss scaler), the gradient norm (clipping),
    # and with the distributed optimizer the all-gather of the updated shards.
    stats = "intra-dist-opt" if dist_opt else "tp-pp"
    mixed = dist_opt or args.fp16 or args.bf16              # FP32Optimizer has no scaler
    if mixed and (args.fp16 or args.loss_scale is not None):
        tally.add(stats, 4)
    if args.clip_grad > 0:
        tally.add(stats, 4)
    if dist_opt:
        for plist, (buckets, _) in stage:
            for start, end in buckets:
                tally.add(expert_key(plist, "dp-cp"), (end - start) // shards(args, plist, dp) * e)
    step_traffic(args, tally)                                  # experts: their statistics
    if pp_rank == pp - 1:   # train_step's loss: [sum, tokens] of the step, summed over dp x cp
        tally.add("dp-cp", 8)
    return tally
