"""The model's parameters on each rank, from the arguments alone: the list GPTModel registers,
cut by tp, pp and vp the way the layers cut it. The ground floor of the estimate
(theoretical_memory_usage.py): memory, activations and communication all start from here.
"""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

from minitron.core.layer_patterns import moe_layer_pattern
from minitron.core.ssm.mamba_hybrid_layer_allocation import Symbols, layer_symbols
from minitron.training.theoretical_mamba import hybrid_chunk_layers, mamba_layer_params
from minitron.training.theoretical_param_type import Param, _flag  # noqa: F401  (Param: re-exported)

# Bytes per element, by torch's dtype name: the estimate's tensors, and the trace's records
# (cli/views/diff.py sums what a traced run sent with this table).
DTYPE_BYTES = {"float64": 8, "float32": 4, "bfloat16": 2, "float16": 2, "int64": 8, "int32": 4,
               "int16": 2, "int8": 1, "uint8": 1, "bool": 1}


def query_groups(args) -> int:
    """Key/value heads: --num-query-groups with --group-query-attention, else one per head."""
    if _flag(args, "group_query_attention", False) and _flag(args, "num_query_groups"):
        return args.num_query_groups
    return args.num_attention_heads


def layer_params(args, layer: int) -> list[Param]:
    """One transformer layer's parameters on a tensor-parallel rank, in registration order."""
    if _flag(args, "hybrid_layer_pattern"):   # a hybrid model's layer: Mamba, or half a transformer layer
        return hybrid_layer_params(args, layer, layer_params)
    t, h = args.tensor_model_parallel_size, args.hidden_size
    bias = _flag(args, "add_bias_linear", True)        # --disable-bias-linear
    sp = bool(args.sequence_parallel) and t > 1
    norm_bias = _flag(args, "normalization", "LayerNorm") != "RMSNorm"
    heads, groups = args.num_attention_heads, query_groups(args)
    q = args.kv_channels * heads                       # query projection width
    qkv = (q + 2 * args.kv_channels * groups) // t     # q, k and v of this rank's heads
    gated = _flag(args, "swiglu", False) or _flag(args, "quick_geglu", False)
    ffn = args.ffn_hidden_size * (2 if gated else 1) // t
    p = f"decoder.layers.{layer}."

    def norm(name, width=h, summed=sp):
        out = [Param(p + name + ".weight", width, sequence_parallel=summed)]
        return out + ([Param(p + name + ".bias", width, sequence_parallel=summed)] if norm_bias else [])

    mla = _flag(args, "multi_latent_attention", False)
    if mla:
        q = args.v_head_dim * heads                    # linear_proj reads n value heads
    out = norm("input_layernorm")
    out += [] if mla else [Param(p + "self_attention.linear_qkv.weight", qkv * h, row=h)]
    qkv_bias = bias or _flag(args, "add_qkv_bias", False)   # --add-qkv-bias: this one alone (Qwen 2.5)
    out += [Param(p + "self_attention.linear_qkv.bias", qkv)] if qkv_bias and not mla else []
    # --softmax-type learnable: one attention-sink logit per head, split over tp with the heads
    sink = [Param(p + "self_attention.core_attention.softmax_offset", heads // t)]
    out += sink if _flag(args, "softmax_type", "vanilla") == "learnable" else []
    out += [Param(p + "self_attention.linear_proj.weight", h * q // t, row=q // t)]
    out += [Param(p + "self_attention.linear_proj.bias", h, sequence_parallel=sp)] if bias else []
    out += mla_params(args, p + "self_attention.", norm) if mla else []
    if _flag(args, "qk_layernorm", False) and not mla:   # over one head's channels; each TP rank sees its heads
        out += norm("self_attention.q_layernorm", args.kv_channels, t > 1)
        out += norm("self_attention.k_layernorm", args.kv_channels, t > 1)
    out += norm("pre_mlp_layernorm")
    if is_moe_layer(args, layer):
        return out + moe_mlp_params(args, p)
    out += [Param(p + "mlp.linear_fc1.weight", ffn * h, row=h)]
    out += [Param(p + "mlp.linear_fc1.bias", ffn)] if bias else []
    out += [Param(p + "mlp.linear_fc2.weight", h * args.ffn_hidden_size // t, row=args.ffn_hidden_size // t)]
    out += [Param(p + "mlp.linear_fc2.bias", h, sequence_parallel=sp)] if bias else []
    return out


def mla_params(args, p: str, norm) -> list[Param]:
    """Multi-latent attention's projections on a TP rank, after linear_proj: all column-parallel
    and bias-free, the down projections cut by output columns too; with --qk-layernorm the
    latents' norms, replicated (each rank normalises the whole latent)."""
    t, h, heads = args.tensor_model_parallel_size, args.hidden_size, args.num_attention_heads
    q_head, rank = args.qk_head_dim + args.qk_pos_emb_head_dim, args.q_lora_rank
    if rank is None:
        out = [Param(p + "linear_q_proj.weight", h * heads * q_head // t, row=h)]
    else:
        out = [Param(p + "linear_q_down_proj.weight", h * rank // t, row=h),
               Param(p + "linear_q_up_proj.weight", rank * heads * q_head // t, row=rank)]
    out += [Param(p + "linear_kv_down_proj.weight", h * (args.kv_lora_rank + args.qk_pos_emb_head_dim) // t, row=h),
            Param(p + "linear_kv_up_proj.weight", args.kv_lora_rank * heads * (args.qk_head_dim + args.v_head_dim) // t,
                  row=args.kv_lora_rank)]
    if _flag(args, "qk_layernorm", False):
        out += norm("self_attention.q_layernorm", rank) if rank is not None else []
        out += norm("self_attention.kv_layernorm", args.kv_lora_rank)
    return out


def is_moe_layer(args, layer: int) -> bool:
    """With --num-experts, layers 0, f, 2f, ... (0-based; f = --moe-layer-freq) have experts."""
    if _flag(args, "hybrid_layer_pattern"):   # a hybrid model's MoE layers are its pattern's E
        return args.hybrid_layer_pattern.replace("|", "")[layer] == "E"
    return bool(_flag(args, "num_experts")) and moe_layer_pattern(args.moe_layer_freq, args.num_layers)[layer] == 1


def moe_mlp_params(args, p: str) -> list[Param]:
    """An MoE layer's MLP on a rank (moe/): the router's [E, h] weight (and, with biases, its
    [E] bias), replicated like a norm; the shared expert, split over tp like the dense MLP (no
    biases: Megatron allows none); then this expert-parallel rank's E/ep experts, fc1 and fc2
    each cut by expert tp, with whole biases when expert tp is 1 (the only case allowing them).
    With --swiglu every fc1 (the shared expert's too) is [gate | up], twice as wide. With
    --moe-latent-size L the routed experts are L wide, and two whole h x L projections (with
    biases if any), replicated like the router, take the tokens there and back."""
    h, ep = args.hidden_size, args.expert_model_parallel_size
    latent = _flag(args, "moe_latent_size", None)
    t = args.tensor_model_parallel_size
    sp = bool(args.sequence_parallel) and t > 1
    bias = _flag(args, "add_bias_linear", True)
    ffn = args.moe_ffn_hidden_size // args.expert_tensor_parallel_size
    gated = 2 if _flag(args, "swiglu", False) or _flag(args, "quick_geglu", False) else 1
    out = [Param(p + "mlp.router.weight", args.num_experts * h, sequence_parallel=sp, row=h)]
    out += [Param(p + "mlp.router.bias", args.num_experts, sequence_parallel=sp)] if bias else []
    for j, (a, b) in enumerate(((latent, h), (h, latent)) if latent else ()):   # fc1: h -> L, fc2: L -> h
        out += [Param(f"{p}mlp.fc{j + 1}_latent_proj.weight", a * b, sequence_parallel=sp, row=b)]
        out += [Param(f"{p}mlp.fc{j + 1}_latent_proj.bias", a, sequence_parallel=sp)] if bias else []
    x = latent or h   # what the routed experts see
    for j in range(args.num_experts // ep):
        q = f"{p}mlp.experts.local_experts.{j}."
        out += [Param(q + "linear_fc1.weight", gated * ffn * x, expert=True, row=x)]
        out += [Param(q + "linear_fc1.bias", gated * ffn, expert=True)] if bias else []
        out += [Param(q + "linear_fc2.weight", x * ffn, expert=True, row=ffn)]
        out += [Param(q + "linear_fc2.bias", x, expert=True)] if bias else []
    shared = _flag(args, "moe_shared_expert_intermediate_size", None)
    if shared:
        out += [Param(p + "mlp.shared_experts.linear_fc1.weight", gated * shared // t * h, row=h),
                Param(p + "mlp.shared_experts.linear_fc2.weight", h * shared // t, row=shared // t)]
    return out


def hybrid_layer_params(args, layer: int, gpt_layer_params) -> list[Param]:
    """Layer ``layer`` (0-based) of the pattern: a Mamba layer, or the attention or MLP half of
    the GPT layer the accountant already knows (``gpt_layer_params``, asked of a GPT twin)."""
    symbol = layer_symbols(args.hybrid_layer_pattern)[layer]
    p = f"decoder.layers.{layer}."
    if symbol == Symbols.MAMBA:
        return mamba_layer_params(args, p)
    gpt = SimpleNamespace(**{**vars(args), "hybrid_layer_pattern": None, "num_experts": None})
    whole = gpt_layer_params(gpt, layer)
    mlp_half = [x for x in whole if x.name.startswith((p + "pre_mlp_layernorm", p + "mlp."))]
    if symbol == Symbols.ATTENTION:
        return [x for x in whole if x not in mlp_half]
    if symbol == Symbols.MLP:
        return mlp_half
    return [x for x in mlp_half if not x.name.startswith(p + "mlp.")] + moe_mlp_params(args, p)   # E


def chunk_layers(args, pp_rank: int, chunk: int) -> range:
    """The layer indices (0-based) of model chunk ``chunk`` on pipeline rank ``pp_rank``."""
    if _flag(args, "hybrid_layer_pattern"):   # the pattern's '|' segments, which may be uneven
        return hybrid_chunk_layers(args, pp_rank, chunk)
    # even or uneven, the split the model builds (core/pipeline_parallel/layer_layout.py)
    from minitron.core.pipeline_parallel.layer_layout import counts_from, stage_layers
    return stage_layers(counts_from(args), args.pipeline_model_parallel_size, pp_rank, chunk)


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
        out.append(Param("embedding.word_embeddings.weight", vocab * h, shared_embedding=tied and split, row=h))
        if _flag(args, "position_embedding_type", "learned_absolute") == "learned_absolute":
            out.append(Param("embedding.position_embeddings.weight", args.max_position_embeddings * h, row=h))
    for layer in chunk_layers(args, pp_rank, chunk):
        out += layer_params(args, layer)
    if post:
        sp = bool(args.sequence_parallel) and t > 1
        final = "decoder.final_norm" if _flag(args, "hybrid_layer_pattern") else "decoder.final_layernorm"
        out.append(Param(final + ".weight", h, sequence_parallel=sp))
        if _flag(args, "normalization", "LayerNorm") != "RMSNorm":
            out.append(Param(final + ".bias", h, sequence_parallel=sp))
        mtp = bool(_flag(args, "mtp_num_layers"))
        if mtp and not pre:   # multi-token prediction's copy of the embedding, kept like a tied one
            out.append(Param("embedding.word_embeddings.weight", vocab * h, shared_embedding=split, row=h))
        if not ((pre or mtp) and tied):
            out.append(Param("output_layer.weight", vocab * h, shared_embedding=tied and split, row=h))
        out += mtp_params(args) if mtp else []
    return out


def mtp_params(args) -> list[Param]:
    """The multi-token-prediction layers on the last stage (multi_token_prediction.py): per depth
    two norms, eh_proj [h/t, 2h] and a layer like the decoder's last, then a final norm."""
    t, h, last = args.tensor_model_parallel_size, args.hidden_size, args.num_layers - 1
    sp = bool(args.sequence_parallel) and t > 1
    bias = _flag(args, "normalization", "LayerNorm") != "RMSNorm"
    out = []
    for k in range(args.mtp_num_layers):
        p = f"mtp.layers.{k}."

        def norm(name):
            return [Param(p + name + ".weight", h, sequence_parallel=sp)] + (
                [Param(p + name + ".bias", h, sequence_parallel=sp)] if bias else [])
        out += norm("enorm") + norm("hnorm") + [Param(p + "eh_proj.weight", h // t * 2 * h, row=2 * h)]
        out += [replace(q, name=q.name.replace(f"decoder.layers.{last}.", p + "mtp_model_layer."))
                for q in layer_params(args, last)]
        out += norm("final_layernorm")
    return out


def total_params(args) -> int:
    """Parameters of the whole model, the tied embedding counted once (tp = pp = 1 arithmetic)."""
    if _flag(args, "hybrid_layer_pattern"):
        return hybrid_total_params(args)
    h, layers = args.hidden_size, args.num_layers
    one = type("Serial", (), {**vars(args), "tensor_model_parallel_size": 1, "sequence_parallel": False,
                              "expert_model_parallel_size": 1, "expert_tensor_parallel_size": 1})
    dense = sum(p.numel for p in layer_params(one, 1 if layers > 1 and not is_moe_layer(args, 1) else 0))
    moe = sum(1 for i in range(layers) if is_moe_layer(args, i))
    expert_layer = sum(p.numel for p in layer_params(one, 0)) if moe else 0
    embedding = args.padded_vocab_size * h * (1 if not args.untie_embeddings_and_output_weights else 2)
    position = args.max_position_embeddings * h if _flag(args, "position_embedding_type",
                                                         "learned_absolute") == "learned_absolute" else 0
    final_norm = h * (2 if _flag(args, "normalization", "LayerNorm") != "RMSNorm" else 1)
    mtp = sum(q.numel for q in mtp_params(one)) if _flag(args, "mtp_num_layers") else 0
    return (layers - moe) * dense + moe * expert_layer + embedding + position + final_norm + mtp


def hybrid_total_params(args) -> int:
    """The whole hybrid model's parameters (tp = pp = 1), the tied embedding counted once."""
    one = SimpleNamespace(**{**vars(args), "tensor_model_parallel_size": 1, "sequence_parallel": False,
                             "expert_model_parallel_size": 1, "expert_tensor_parallel_size": 1})
    h = args.hidden_size
    layers = sum(p.numel for i in range(args.num_layers) for p in layer_params(one, i))
    embedding = args.padded_vocab_size * h * (2 if args.untie_embeddings_and_output_weights else 1)
    position = (args.max_position_embeddings * h
                if _flag(args, "position_embedding_type", "learned_absolute") == "learned_absolute" else 0)
    return layers + embedding + position + h * (2 if _flag(args, "normalization", "LayerNorm") != "RMSNorm" else 1)


def chunks_of(args) -> range:
    return range(args.virtual_pipeline_model_parallel_size or 1)


def num_microbatches(args) -> int:
    return args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)


def recomputed_layers(args, layers: int) -> int:
    """How many of a chunk's ``layers`` run their forward again in backward (full recomputation:
    all of them with --recompute-method uniform, the first --recompute-num-layers with block)."""
    if _flag(args, "recompute_granularity") != "full":
        return 0
    return layers if args.recompute_method == "uniform" else min(args.recompute_num_layers, layers)


def optimizer_moments(args) -> int:
    """fp32 tensors the torch optimizer keeps per element it steps: Adam's two moments
    (exp_avg, exp_avg_sq), SGD's momentum buffer when there is momentum, else none. Megatron's
    optimizer and DeepSpeed's ZeRO both hand the step to that optimizer, so both count these."""
    return 2 if args.optimizer == "adam" else (1 if args.sgd_momentum else 0)


def round_up(n: int, k: int) -> int:
    """n padded up to a multiple of k (the buffers' alignments)."""
    return -(-n // k) * k
