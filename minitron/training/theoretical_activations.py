"""Activation memory: the bytes autograd keeps for backward, per micro-batch and model chunk,
times the micro-batches the pipeline schedule holds at its peak.

Megatron's theoretical_memory_usage.py uses the per-layer table of "Reducing Activation
Recomputation in Large Transformer Models" (34sbh + 5as^2b, divided by t with sequence
parallelism). Here the table is rebuilt from what this code's kernels save, so that it can be
compared with saved-tensor hooks on a real run (scripts/measure_activations.py).
"""

from __future__ import annotations

from minitron.core.pipeline_parallel.pp_rank_microbatches import get_pp_rank_microbatches, get_schedule_table
from minitron.training.theoretical_params import (
    DTYPE_BYTES, _flag, chunk_ends, chunk_layers, query_groups,
)
from minitron.training.theoretical_mamba import hybrid_layer_activations
from minitron.training.theoretical_moe import activation_delta


def mask_bytes(args) -> int:
    """Bytes per element of a dropout mask: CUDA's dropout keeps a bool mask; torch's CPU
    dropout keeps its scaled mask in the activation's own dtype. No backend named: a GPU."""
    return DTYPE_BYTES[args.params_dtype] if args.distributed_backend in ("gloo", "fake") else 1


def _all_to_all_cores(args, s: int, b: int, q: int, heads: int, e: int, m: int) -> dict[str, int]:
    """What the core attention keeps per layer with --cp-comm-type a2a (and a2a+p2p), in place
    of the ring's: the q, k, v the all-to-all made (new tensors; what went in is kept by no one),
    then a2a's unsplit kernel on heads/cp heads of all cp·s tokens, or a2a+p2p's ring over P
    groups, on heads/A heads of A·s tokens each (fp32 output, log-sum-exp, masks by block)."""
    cp, dropout = args.context_parallel_size, args.attention_dropout > 0
    made = 3 * s * b * q * e
    whole = s * cp
    if dropout:   # unfused, as without cp: mask, fp32 softmax, dropout mask, dropped probabilities
        cores = {"a2a": made + whole * whole + heads * b * s * whole * (4 + m + e)}
    else:         # fused kernel: output and log-sum-exp (heads/cp x cp·s = heads x s)
        cores = {"a2a": made + s * b * q * e + heads * b * s * 4}
    levels = _flag(args, "hierarchical_context_parallel_sizes")
    if levels and len(levels) == 2:
        a, p = levels
        cores["a2a+p2p"] = made + s * b * q * 4 + heads * b * s * 4
        cores["a2a+p2p"] += (2 * p + 1) * b * heads * a * (s // 2) ** 2 * 4 if dropout else 0
    return cores


def _mla_saved(args, s: int, local: int, b: int, e: int) -> int:
    """What multi-latent attention keeps between its input and the core attention (one layer):
    the latents as their norms and up projections keep them, rope's rotated channels and angles,
    and the query, key and value it builds (new tensors: concatenations and a copy of v)."""
    t = args.tensor_model_parallel_size
    n, pe, rkv, rq = args.num_attention_heads // t, args.qk_pos_emb_head_dim, args.kv_lora_rank, args.q_lora_rank
    normed = _flag(args, "qk_layernorm", False)
    rms = _flag(args, "normalization", "LayerNorm") == "RMSNorm"

    def latent(width: int, kept_input: int) -> int:
        """A latent's input as kept, and with a norm: its statistics and output (the up projection's input)."""
        if not normed:
            return kept_input
        stats = local * b * width * e + local * b * 4 if rms else 2 * local * b * 4
        return kept_input + stats + local * b * width * e
    # kv: without sequence parallelism the norm keeps a view of the whole [c_kv | k_pe] output.
    kept = latent(rkv, s * b * (rkv + pe) * e if local == s else local * b * rkv * e)
    kept += latent(rq, local * b * rq * e) if rq is not None else 0
    rot = int(pe * args.rotary_percent)
    kept += 2 * s * b * (n + 1) * pe * e + 4 * s * rot * 4   # q_pe and k_pe rotated, twice; cos, sin
    return kept + s * b * n * (2 * (args.qk_head_dim + pe) + args.v_head_dim) * e   # query, key, value


def unit_activation_bytes(args, pp_rank: int, chunk: int) -> int:
    """Bytes autograd keeps for backward from one micro-batch's forward through one chunk.

    Term by term what this code saves (Megatron's paper counts the same places for its
    kernels): each layernorm its input, each linear its input, the attention its q k v and
    either its probabilities (with attention dropout: the unfused path) or its output and
    log-sum-exp (torch's fused kernel), GeLU its input, each dropout its mask. A column-parallel
    linear keeps the layernorm's output it was given: with sequence parallelism that is this
    rank's s/t rows, which it gathers again in backward (layers.py), not the whole sequence."""
    e = DTYPE_BYTES[args.params_dtype]
    t, b, h = args.tensor_model_parallel_size, args.micro_batch_size, args.hidden_size
    s = args.seq_length // args.context_parallel_size        # cp: each rank its share of s
    local = s // t if (args.sequence_parallel and t > 1) else s   # the replicated regions' rows
    heads, q = args.num_attention_heads // t, args.kv_channels * args.num_attention_heads // t
    mla = _flag(args, "multi_latent_attention", False)
    if mla:                                                  # the context is n value heads wide
        q = args.v_head_dim * args.num_attention_heads // t
    groups = max(query_groups(args) // t, 1)   # g < t: a rank computes its group's one key and value
    ffn = args.ffn_hidden_size // t
    pre, post = chunk_ends(args, pp_rank, chunk)
    hd, ad, m = args.hidden_dropout, args.attention_dropout, mask_bytes(args)
    drop = (local * b * h * m) if hd > 0 else 0              # one hidden-dropout mask
    if _flag(args, "normalization", "LayerNorm") == "RMSNorm":   # torch's composite RMSNorm:
        norm = 2 * local * b * h * e + local * b * 4         # input, x/rms, 1/rms
    else:
        norm = local * b * h * e + 2 * local * b * 4         # input, mean and 1/std
    layer = 2 * norm + 2 * local * b * h * e                 # two norms, qkv and fc1 inputs
    if mla:
        qkv = _mla_saved(args, s, local, b, e)
    elif query_groups(args) >= t:
        qkv = s * b * (q + 2 * args.kv_channels * groups) * e  # q, k, v (one tensor)
    else:   # g < t: q, k, v are views of the all-gathered linear_qkv output, which they keep whole
        qkv = s * b * (args.num_attention_heads + 2 * query_groups(args)) * args.kv_channels * e
    layer += qkv
    entering = qkv   # what the core attention keeps of its own inputs (a2a's all-to-all keeps none)
    if mla:   # its rope is counted in _mla_saved, and GPTModel makes none for it
        pass
    elif _flag(args, "position_embedding_type") == "rope":     # rotated q and k, cos and sin twice
        rotated = int(args.kv_channels * args.rotary_percent)
        # rope keeps views of the one tensor itself; its outputs are what attention then keeps
        entering = s * b * (q + args.kv_channels * groups) * e
        layer += entering + 4 * s * rotated * 4
    elif _flag(args, "qk_layernorm", False):
        entering = 0     # the norms keep the one tensor; what attention keeps of theirs is counted there
    cp = args.context_parallel_size
    if cp > 1:   # the ring (context_parallel.py): fp32 output and log-sum-exp, fp32 masks by block
        core = s * b * q * 4 + heads * b * s * 4
        core += (2 * cp + 1) * b * heads * (s // 2) ** 2 * 4 if ad > 0 else 0
    elif ad > 0:  # unfused: causal mask, fp32 softmax, dropout mask, dropped probabilities
        core = s * s + heads * b * s * s * (4 + m + e)
    else:         # fused kernel: its output and log-sum-exp
        core = s * b * q * e + heads * b * s * 4
    if groups * t != args.num_attention_heads:   # GQA: keys and values repeated per query head
        core += 2 * s * b * q * e
    others = _all_to_all_cores(args, s, b, q, heads, e, m) if cp > 1 else {}
    layer += core + s * b * q * e                            # + linear_proj's input (context)
    if _flag(args, "swiglu", False):   # fc1's [gate | up], silu(gate), their product (fc2's input)
        layer += 4 * s * b * ffn * e
    else:                              # GeLU's input, fc2's input
        layer += 2 * s * b * ffn * e
    layer += 2 * drop
    granularity = _flag(args, "recompute_granularity")
    if granularity == "selective":     # core attention recomputed: only its q, k, v stay
        layer -= core
    kinds = _flag(args, "cp_comm_type") or ["p2p"]
    kinds = [kinds] if isinstance(kinds, str) else kinds
    each = [layer - core - entering + others[kinds[i % len(kinds)]]
            if kinds[i % len(kinds)] in others and granularity != "selective" else layer
            for i in chunk_layers(args, pp_rank, chunk)]
    if _flag(args, "hybrid_layer_pattern"):   # a Mamba layer, or one half of the layer above
        each = hybrid_layer_activations(args, chunk_layers(args, pp_rank, chunk), layer, norm, drop, local, s, b, e)
    layers = len(each)
    total = sum(each)
    if granularity == "full":          # a checkpointed run of layers keeps only its input
        n = args.recompute_num_layers
        kept = local * b * h * e
        if args.recompute_method == "uniform":
            total = -(-layers // n) * kept
        else:                          # block: the first n layers of the stage, one by one
            total = min(n, layers) * kept + sum(each[n:])
    total += activation_delta(args, pp_rank, chunk)          # experts instead of the MLP
    if pre:
        keys = 2 + (1 if post else 0)                        # tokens, position ids (labels)
        total += keys * b * args.seq_length * 8              # the broadcast int64 buffer
        if t > 1:
            total += b * args.seq_length * (8 + 1)           # local ids, out-of-range mask
        total += drop
    if post:
        vocab = args.padded_vocab_size // t
        total += norm + local * b * h * e                    # final norm, output layer input
        total += s * b * (vocab * 4 + 1 + 8)                 # softmax (fp32), mask, targets
        total += b * args.seq_length * 4                     # the loss mask
    return total


def in_flight_chunks(args, pp_rank: int, num_microbatches: int) -> list[int]:
    """The model chunk of each micro-batch whose activations are held at the schedule's peak:
    the warm-up's forwards and the first steady-state forward, which runs before the first
    backward frees anything (the schedules' own count, get_pp_rank_microbatches)."""
    pp, vp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size
    if pp == 1:
        return [0]
    group = getattr(args, "microbatch_group_size_per_vp_stage", None) or pp
    total, _, warmup, _ = get_pp_rank_microbatches(
        num_microbatches, vp or 1, group, pipeline_parallel_size=pp, pipeline_parallel_rank=pp_rank,
        virtual_pipeline_parallel_size=vp)
    table = get_schedule_table(num_microbatches, vp or 1, group)   # the interleaved schedule's own order
    return [table[k][1] for k in range(min(warmup + 1, total))]
