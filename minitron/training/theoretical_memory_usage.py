"""What a layout costs each rank, worked out from the arguments alone: parameters, memory, and
the bytes it hands to communication in one training iteration. No process, no torch.

Megatron's file of this name answers "will it fit?" for the most loaded rank with two
formulas: 18 bytes per parameter (6 + 12/dp with the distributed optimizer) and the activation
table of "Reducing Activation Recomputation in Large Transformer Models". Here every rank gets
its own answer, and the answer is built from what *this* code allocates and sends, tensor by
tensor, so that it can be checked exactly against a traced run (`minitron estimate --check`):

* parameters: the model's own list (model_params below), in the order the modules register
  them, cut by tp, pp and vp as the layers cut them;
* gradients: the DDP buffer those parameters are laid into, padded as param_and_grad_buffer
  pads it for the distributed optimizer;
* optimizer: fp32 main copies (for a 16-bit model) and Adam's two moments, for the slice of
  the buffer this data-parallel rank owns with --use-distributed-optimizer;
* activations: what autograd saves for backward in one micro-batch of each model chunk, times
  the micro-batches the pipeline schedule keeps in flight (activation_bytes below);
* communication: every collective train_step makes, by group kind (the keys of
  `minitron groups --json`), with the bytes of the tensor handed to it; point-to-point, the
  bytes sent (comm_bytes below).

Covered: tp, pp (1F1B and interleaved), dp, cp (the ring), sequence parallelism, the
distributed optimizer, fp32/bf16/fp16, the modern options (rope, swiglu, RMSNorm, GQA, untied
embeddings) and recomputation. Not yet: mixture-of-experts layers (`minitron estimate` refuses
--num-experts), whose all-to-all sizes depend on the routing.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field

from minitron.core.rank_generator import RankGenerator

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "bool": 1}
_PARAM_START_ALIGN, _BUCKET_END_ALIGN = 64, 128   # param_and_grad_buffer's padding, elements


@dataclass(frozen=True)
class Param:
    name: str
    numel: int
    shared_embedding: bool = False   # the tied matrix on a pipeline stage (its own DDP bucket)
    sequence_parallel: bool = False  # replicated and seeing part of the sequence: summed over tp


@dataclass
class RankCost:
    """One rank's (or one role's) answer; ``comm`` maps a group key to bytes."""
    rank: int
    role: tuple
    params: int
    memory: dict
    comm: dict = field(default_factory=dict)
    calls: dict = field(default_factory=dict)   # group key -> number of calls

    def as_json(self) -> dict:
        return {"rank": self.rank, "params": self.params, "memory_bytes": dict(self.memory),
                "comm_bytes": dict(self.comm)}


# --- the model's parameters ------------------------------------------------------------------
def _flag(args, name, default=None):
    return getattr(args, name, default)


def query_groups(args) -> int:
    """Key/value heads: --num-query-groups with --group-query-attention, else one per head."""
    if _flag(args, "group_query_attention", False) and _flag(args, "num_query_groups"):
        return args.num_query_groups
    return args.num_attention_heads


def layer_params(args, layer: int) -> list[Param]:
    """One transformer layer's parameters on a tensor-parallel rank, in registration order."""
    t, h = args.tensor_model_parallel_size, args.hidden_size
    bias = not _flag(args, "disable_bias_linear", False)
    sp = bool(args.sequence_parallel) and t > 1
    norm_bias = _flag(args, "normalization", "LayerNorm") != "RMSNorm"
    heads, groups = args.num_attention_heads, query_groups(args)
    q = args.kv_channels * heads                       # query projection width
    qkv = (q + 2 * args.kv_channels * groups) // t     # q, k and v of this rank's heads
    ffn = args.ffn_hidden_size * (2 if _flag(args, "swiglu", False) else 1) // t
    p = f"decoder.layers.{layer}."

    def norm(name):
        out = [Param(p + name + ".weight", h, sequence_parallel=sp)]
        return out + ([Param(p + name + ".bias", h, sequence_parallel=sp)] if norm_bias else [])

    out = norm("input_layernorm") + [Param(p + "self_attention.linear_qkv.weight", qkv * h)]
    out += [Param(p + "self_attention.linear_qkv.bias", qkv)] if bias else []
    out += [Param(p + "self_attention.linear_proj.weight", h * q // t)]
    out += [Param(p + "self_attention.linear_proj.bias", h, sequence_parallel=sp)] if bias else []
    out += norm("pre_mlp_layernorm") + [Param(p + "mlp.linear_fc1.weight", ffn * h)]
    out += [Param(p + "mlp.linear_fc1.bias", ffn)] if bias else []
    out += [Param(p + "mlp.linear_fc2.weight", h * args.ffn_hidden_size // t)]
    out += [Param(p + "mlp.linear_fc2.bias", h, sequence_parallel=sp)] if bias else []
    return out


def chunk_layers(args, pp_rank: int, chunk: int) -> range:
    """The layer indices (0-based) of model chunk ``chunk`` on pipeline rank ``pp_rank``."""
    pp, vp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size or 1
    per = args.num_layers // (pp * vp)
    first = chunk * (args.num_layers // vp) + pp_rank * per
    return range(first, first + per)


def chunk_ends(args, pp_rank: int, chunk: int) -> tuple[bool, bool]:
    """(pre_process, post_process) of a model chunk: holds the embedding / the output layer."""
    pp, vp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size or 1
    return pp_rank == 0 and chunk == 0, pp_rank == pp - 1 and chunk == vp - 1


def model_params(args, pp_rank: int, chunk: int) -> list[Param]:
    """A model chunk's parameters as GPTModel registers them: embedding, layers, final norm,
    output layer (absent where the tied output reads the embedding's own matrix)."""
    t, h = args.tensor_model_parallel_size, args.hidden_size
    pre, post = chunk_ends(args, pp_rank, chunk)
    tied = not args.untie_embeddings_and_output_weights
    split = args.pipeline_model_parallel_size > 1   # the tied matrix lives twice: marked shared
    vocab = args.padded_vocab_size // t
    out = []
    if pre:
        out.append(Param("embedding.word_embeddings.weight", vocab * h, shared_embedding=tied and split))
        if _flag(args, "position_embedding_type", "learned_absolute") == "learned_absolute":
            out.append(Param("embedding.position_embeddings.weight", args.max_position_embeddings * h))
    for layer in chunk_layers(args, pp_rank, chunk):
        out += layer_params(args, layer)
    if post:
        sp = bool(args.sequence_parallel) and t > 1
        out.append(Param("decoder.final_layernorm.weight", h, sequence_parallel=sp))
        if _flag(args, "normalization", "LayerNorm") != "RMSNorm":
            out.append(Param("decoder.final_layernorm.bias", h, sequence_parallel=sp))
        if not (pre and tied):
            out.append(Param("output_layer.weight", vocab * h, shared_embedding=tied and split))
    return out


def total_params(args) -> int:
    """Parameters of the whole model, the tied embedding counted once (tp = pp = 1 arithmetic)."""
    h, layers = args.hidden_size, args.num_layers
    one = type("Serial", (), {**vars(args), "tensor_model_parallel_size": 1, "sequence_parallel": False})
    per_layer = sum(p.numel for p in layer_params(one, 0))
    embedding = args.padded_vocab_size * h * (1 if not args.untie_embeddings_and_output_weights else 2)
    position = args.max_position_embeddings * h if _flag(args, "position_embedding_type",
                                                         "learned_absolute") == "learned_absolute" else 0
    final_norm = h * (2 if _flag(args, "normalization", "LayerNorm") != "RMSNorm" else 1)
    return layers * per_layer + embedding + position + final_norm


# --- the gradient buffer ----------------------------------------------------------------------
def _pad(n: int, k: int) -> int:
    return -(-n // k) * k


def buffer_layout(params: list[Param], dp: int, dist_opt: bool) -> tuple[list[tuple[int, int]], dict]:
    """param_and_grad_buffer._lay_out without tensors: the buckets [(start, end)] and each
    parameter's (start, end). Parameters are laid out last first; with the distributed
    optimizer each starts on a 64-element boundary, each bucket ends on lcm(dp, 128), and the
    tied embedding has a bucket of its own."""
    align = math.lcm(dp, _BUCKET_END_ALIGN)
    buckets, where, next_free, bucket_start, in_bucket = [], {}, 0, 0, 0

    def close(end: int) -> int:
        nonlocal bucket_start, in_bucket
        padded = _pad(end, align) if dist_opt else end
        buckets.append((bucket_start, padded))
        bucket_start, in_bucket = padded, 0
        return padded

    for param in reversed(params):
        start = _pad(next_free, _PARAM_START_ALIGN) if dist_opt else next_free
        alone = dist_opt and param.shared_embedding
        if alone and in_bucket:
            start = close(start)
        where[param.name] = (start, start + param.numel)
        in_bucket += 1
        next_free = close(start + param.numel) if alone else start + param.numel
    if in_bucket:
        close(next_free)
    return buckets, where


def owned_numel(layout: tuple[list, dict], dp: int, dp_rank: int) -> int:
    """Elements of real parameters inside this data-parallel rank's shards (its optimizer
    state), from buffer_layout's answer: padding is nobody's."""
    buckets, where = layout
    spans = sorted(where.values())
    starts = [a for a, _ in spans]
    owned = 0
    for start, end in buckets:
        size = (end - start) // dp
        lo, hi = start + dp_rank * size, start + (dp_rank + 1) * size
        i = max(bisect.bisect_right(starts, lo) - 1, 0)   # spans are disjoint and sorted
        while i < len(spans) and spans[i][0] < hi:
            a, b = spans[i]
            owned += max(0, min(b, hi) - max(a, lo))
            i += 1
    return owned


# --- memory -----------------------------------------------------------------------------------
def chunks_of(args) -> range:
    return range(args.virtual_pipeline_model_parallel_size or 1)


def stage_buffers(args, pp_rank: int) -> list[tuple[list[Param], tuple]]:
    """Each model chunk of a pipeline stage: its parameters and its buffer layout."""
    dp = args.data_parallel_size * args.context_parallel_size
    return [(plist, buffer_layout(plist, dp, args.use_distributed_optimizer))
            for plist in (model_params(args, pp_rank, chunk) for chunk in chunks_of(args))]


def weight_and_optimizer_bytes(args, stage: list, dp_rank: int) -> tuple[int, dict]:
    """(parameters on the rank, {"params", "grads", "optimizer"} bytes); ``stage`` is
    stage_buffers' answer for the rank's pipeline stage."""
    e = DTYPE_BYTES[args.params_dtype]
    grad_e = 4 if args.accumulate_allreduce_grads_in_fp32 else e
    dp, dist_opt = args.data_parallel_size * args.context_parallel_size, args.use_distributed_optimizer
    params = sum(p.numel for plist, _ in stage for p in plist)
    buffered = sum(layout[0][-1][1] for _, layout in stage if layout[0])
    owned = sum(owned_numel(layout, dp, dp_rank) for _, layout in stage) if dist_opt else params
    moments = 2 if args.optimizer == "adam" else (1 if args.sgd_momentum else 0)
    main_copy = 4 if e != 4 else 0   # a 16-bit model is stepped through fp32 main params
    return params, {"params": (buffered if dist_opt else params) * e, "grads": buffered * grad_e,
                    "optimizer": owned * (4 * moments + main_copy)}


def mask_bytes(args) -> int:
    """Bytes per element of a dropout mask: CUDA's dropout keeps a bool mask; torch's CPU
    dropout keeps its scaled mask in the activation's own dtype. No backend named: a GPU."""
    return DTYPE_BYTES[args.params_dtype] if args.distributed_backend in ("gloo", "fake") else 1


def unit_activation_bytes(args, pp_rank: int, chunk: int) -> int:
    """Bytes autograd keeps for backward from one micro-batch's forward through one chunk.

    Term by term what this code saves (Megatron's paper counts the same places for its
    kernels): each layernorm its input, each linear its input, the attention its q k v and
    either its probabilities (with attention dropout: the unfused path) or its output and
    log-sum-exp (torch's fused kernel), GeLU its input, each dropout its mask. Without
    sequence parallelism the linears' input is the layernorm's output; with it, the gathered
    whole sequence (minitron's linears keep it; Megatron re-gathers it in backward)."""
    e = DTYPE_BYTES[args.params_dtype]
    t, b, h = args.tensor_model_parallel_size, args.micro_batch_size, args.hidden_size
    s = args.seq_length // args.context_parallel_size        # cp: each rank its share of s
    local = s // t if (args.sequence_parallel and t > 1) else s   # the replicated regions' rows
    heads, q = args.num_attention_heads // t, args.kv_channels * args.num_attention_heads // t
    groups = query_groups(args) // t
    ffn = args.ffn_hidden_size // t
    pre, post = chunk_ends(args, pp_rank, chunk)
    hd, ad, m = args.hidden_dropout, args.attention_dropout, mask_bytes(args)
    drop = (local * b * h * m) if hd > 0 else 0              # one hidden-dropout mask
    if _flag(args, "normalization", "LayerNorm") == "RMSNorm":   # torch's composite RMSNorm:
        norm = 2 * local * b * h * e + local * b * 4         # input, x/rms, 1/rms
    else:
        norm = local * b * h * e + 2 * local * b * 4         # input, mean and 1/std
    layer = 2 * norm + 2 * s * b * h * e                     # two norms, qkv and fc1 inputs
    layer += s * b * (q + 2 * args.kv_channels * groups) * e  # q, k, v (one tensor)
    if _flag(args, "position_embedding_type") == "rope":     # rotated q and k, cos and sin twice
        rotated = int(args.kv_channels * args.rotary_percent)
        layer += s * b * (q + args.kv_channels * groups) * e + 4 * s * rotated * 4
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
    layer += core + s * b * q * e                            # + linear_proj's input (context)
    if _flag(args, "swiglu", False):   # fc1's [gate | up], silu(gate), their product (fc2's input)
        layer += 4 * s * b * ffn * e
    else:                              # GeLU's input, fc2's input
        layer += 2 * s * b * ffn * e
    layer += 2 * drop
    granularity = _flag(args, "recompute_granularity")
    if granularity == "selective":     # core attention recomputed: only its q, k, v stay
        layer -= core
    layers = len(chunk_layers(args, pp_rank, chunk))
    total = layers * layer
    if granularity == "full":          # a checkpointed run of layers keeps only its input
        n = args.recompute_num_layers
        kept = local * b * h * e
        if args.recompute_method == "uniform":
            total = -(-layers // n) * kept
        else:                          # block: the first n layers of the stage, one by one
            total = min(n, layers) * kept + max(layers - n, 0) * layer
    if pre:
        keys = 2 + (1 if post else 0)                        # tokens, position ids (labels)
        total += keys * b * args.seq_length * 8              # the broadcast int64 buffer
        if t > 1:
            total += b * args.seq_length * (8 + 1)           # local ids, out-of-range mask
        total += drop
    if post:
        vocab = args.padded_vocab_size // t
        total += norm + s * b * h * e                        # final norm, output layer input
        total += s * b * (vocab * 4 + 1 + 8)                 # softmax (fp32), mask, targets
        total += b * args.seq_length * 4                     # the loss mask
    return total


def in_flight_chunks(args, pp_rank: int, num_microbatches: int) -> list[int]:
    """The model chunk of each micro-batch whose activations are held at the schedule's peak."""
    pp, vp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size
    if pp == 1:
        return [0]
    if vp is None:   # 1F1B: pp - r forwards before the first backward
        return [0] * min(pp - pp_rank, num_microbatches)
    total = num_microbatches * vp
    if num_microbatches == pp:
        peak = total
    else:
        peak = min((pp - pp_rank - 1) * 2 + (vp - 1) * pp + 1, total)
    return [(k // pp) % vp for k in range(peak)]


def num_microbatches(args) -> int:
    return args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)


def activation_bytes(args, pp_rank: int) -> int:
    return sum(unit_activation_bytes(args, pp_rank, c) for c in in_flight_chunks(args, pp_rank, num_microbatches(args)))


# --- every rank -------------------------------------------------------------------------------
def role_of(args, rank: int) -> tuple[int, int]:
    """(pipeline rank, data-parallel rank): all a rank's costs depend on (the second only
    through its optimizer shard, so it is 0 without the distributed optimizer)."""
    return _roles(args)(rank)


def _roles(args):
    """rank -> role, reading the rank's digits in the layout's mixed radix (rank_generator)."""
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    dense = RankGenerator(tp=tp, ep=1, dp=args.world_size // (tp * pp * cp), pp=pp, cp=cp, order=args.order)

    def role(rank: int) -> tuple[int, int]:
        digits = {}
        for d in dense.order:
            digits[d], rank = rank % dense.size[d], rank // dense.size[d]
        dp_rank = digits["dp"] * cp + digits["cp"]   # its place in the dp-cp group
        return digits["pp"], dp_rank if args.use_distributed_optimizer else 0
    return role


def estimate(args) -> list[RankCost]:
    """One RankCost per rank of ``args.world_size`` (validated pretrain args). A pipeline stage
    is worked out once, a role (stage, optimizer shard) once, whatever the world size."""
    from minitron.training.theoretical_comm import comm_bytes

    stages: dict[int, tuple] = {}
    roles: dict[tuple, RankCost] = {}
    out, role_of_rank = [], _roles(args)
    for rank in range(args.world_size):
        role = role_of_rank(rank)
        if role[0] not in stages:
            stage = stage_buffers(args, role[0])
            stages[role[0]] = stage, activation_bytes(args, role[0]), comm_bytes(args, role[0], stage)
        if role not in roles:
            stage, activations, tally = stages[role[0]]
            params, memory = weight_and_optimizer_bytes(args, stage, role[1])
            memory["activations"] = activations
            roles[role] = RankCost(rank, role, params, memory, {k: v[0] for k, v in tally.items()},
                                   {k: v[1] for k, v in tally.items()})
        cost = roles[role]
        out.append(RankCost(rank, role, cost.params, cost.memory, cost.comm, cost.calls))
    return out


def estimate_json(args) -> dict:
    return {"total_params": total_params(args), "ranks": [c.as_json() for c in estimate(args)]}
