"""validate_args' checks of the model's optional features: the modern GPT options and
activation recomputation, context parallelism, and which MoE steps a command refuses (the MoE
flags themselves: arguments_moe.py).

Megatron keeps them in its one arguments.py; here they have a file of their own so that
arguments.py reads as the core path (layout, model shape, batch, training). Each check raises
ArgumentError with one line a user can act on, before any rank starts.
"""

from __future__ import annotations

import math

from minitron.core.pipeline_parallel.layer_layout import counts_from
from minitron.core.ssm.mamba_hybrid_layer_allocation import select_pipeline_segment
from minitron.training.argument_groups import require


def validate_modern_options(args):
    tp, heads = args.tensor_model_parallel_size, args.num_attention_heads
    if args.swiglu and args.ffn_hidden_size is None:
        # Megatron's default: two fc1 matrices instead of one, so 2/3 of 4h keeps the MLP's
        # parameter count near the GeLU MLP's; rounded down to a multiple of 64.
        args.ffn_hidden_size = int((4 * args.hidden_size * 2 / 3) / 64) * 64
        require(args.ffn_hidden_size > 0, f"--swiglu sizes the MLP as 8h/3 rounded down to a multiple of 64, "
                 f"which is 0 for --hidden-size {args.hidden_size}: give --ffn-hidden-size")
    if args.group_query_attention:
        groups = args.num_query_groups
        require(groups is not None, "--group-query-attention needs --num-query-groups G (heads per key/value)")
        require(heads % groups == 0, f"--num-attention-heads {heads} is not divisible by --num-query-groups "
                 f"{groups}: each group is the same number of query heads")
        # Megatron's rule: each rank computes whole groups (g % tp == 0), or tp/g ranks share
        # one group's key and value (tp % g == 0; SelfAttention all-gathers them).
        require(groups % tp == 0 or tp % groups == 0, f"--num-query-groups {groups} must be a multiple or a "
                 f"divisor of --tensor-model-parallel-size {tp}: ranks compute whole groups, or share one")
    else:
        require(args.num_query_groups is None, "--num-query-groups needs --group-query-attention")
    validate_position_embedding(args)
    if args.position_embedding_type == "rope" and args.hidden_size % heads == 0:
        d = args.kv_channels or args.hidden_size // heads
        rot = d if args.rotary_percent >= 1.0 else int(d * args.rotary_percent)
        require(rot >= 2 and rot % 2 == 0, f"rope rotates channel pairs: --rotary-percent {args.rotary_percent:g} "
                 f"of {d} channels per head is {rot}, which must be even and at least 2")
    # DeepSpeed's engine sums no replicated gradient over TP (hence its refusal of
    # --sequence-parallel); the per-head norms' gradients are partial over TP in the same way.
    require(not (args.qk_layernorm and getattr(args, "deepspeed", False) and tp > 1),
            "--qk-layernorm with --deepspeed and --tensor-model-parallel-size > 1: the per-head norms' "
            "gradients need a sum over the tensor-parallel group that only Megatron's path does; drop one")
    if args.recompute_activations:
        args.recompute_granularity = "selective"     # Megatron's shorthand
    granularity, method, n = args.recompute_granularity, args.recompute_method, args.recompute_num_layers
    if granularity is None:
        require(method is None and n is None,
                 "--recompute-method and --recompute-num-layers need --recompute-granularity full")
    elif granularity == "selective":
        require(method is None and n is None, "--recompute-granularity selective recomputes --recompute-modules "
                 "in every layer: drop --recompute-method and --recompute-num-layers")
    else:
        most = most_layers_per_rank(args)
        require(method is not None, "--recompute-granularity full needs --recompute-method uniform or block")
        require(n is not None and n <= most, f"--recompute-granularity full needs --recompute-num-layers "
                 f"N between 1 and the {most} layers of the fullest pipeline stage")

    validate_window(args)
    validate_mla(args)


def most_layers_per_rank(args) -> int:
    """The layers of the fullest pipeline rank, all its model chunks, as the split builds them.
    Megatron's recompute.py applies --recompute-num-layers to the layers a chunk holds (a stage
    with fewer recomputes all of its own), so with --decoder-first/last-pipeline-num-layers or a
    layout the bound is the biggest stage, not --num-layers // --pipeline-model-parallel-size."""
    pp, vp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size or 1
    if args.hybrid_layer_pattern is not None:   # its '|' may cut unevenly too
        return max(sum(len(select_pipeline_segment(args.hybrid_layer_pattern, r, pp, v)[0]) for v in range(vp))
                   for r in range(pp))
    counts = counts_from(args)   # virtual stage i = chunk * pp + rank
    return max(sum(counts[r::pp]) for r in range(pp))


def validate_window(args):
    """Sliding-window attention: a window to skip, a pattern the length of the model, no ring."""
    freq = args.window_attn_skip_freq
    if args.window_size is None:
        require(freq is None, "--window-attn-skip-freq needs --window-size LEFT,RIGHT (the window it skips)")
        return
    listed = len(freq) if isinstance(freq, list) else args.num_layers
    require(listed == args.num_layers, f"--window-attn-skip-freq lists {listed} layers, but the model has "
            f"--num-layers {args.num_layers}: one 0/1 per layer")
    # The ring of context parallelism hides the future block by block from where each chunk
    # sits in the sequence; it has no notion of a window that ends inside a block.
    require(args.context_parallel_size == 1, "--window-size with --context-parallel-size > 1: minitron's ring "
            "attention has no sliding window; drop one")


# Megatron 0.19's position types that minitron does not build, and why.
_NOT_BUILT = {
    "mrope": "multimodal rope needs the image/video position ids of a vision model",
    "relative": "T5's relative position bias needs Transformer Engine's attention in Megatron too",
}


def validate_position_embedding(args):
    """Megatron's rules for the position flags, and minitron's refusals of the rest."""
    if args.use_rotary_position_embeddings:
        args.position_embedding_type = "rope"      # Megatron's legacy spelling wins, as there
    kind = args.position_embedding_type
    require(kind not in _NOT_BUILT, f"--position-embedding-type {kind}: {_NOT_BUILT.get(kind)}; "
             "minitron has learned_absolute, rope, yarn and none")
    require(args.add_position_embedding or kind == "rope",
            "--no-position-embedding is deprecated (Megatron refuses it too unless the type is rope): "
            "use --position-embedding-type none for a model without positions")
    if kind != "rope":
        given = [flag for flag, on in (("--rotary-interleaved", args.rotary_interleaved),
                                       ("--rotary-seq-len-interpolation-factor",
                                        args.rotary_seq_len_interpolation_factor is not None),
                                       ("--use-rope-scaling", args.use_rope_scaling)) if on]
        require(not given, f"{given[0] if given else ''} shapes rope's angles, and --position-embedding-type "
                 f"is {kind}: add --position-embedding-type rope, or drop it")
    yarn_flags = [flag for flag, value in (
        ("--yarn-original-max-position-embeddings", args.yarn_original_max_position_embeddings),
        ("--yarn-beta-fast", args.yarn_beta_fast), ("--yarn-beta-slow", args.yarn_beta_slow),
        ("--(no-)yarn-correction-range-round-to-int", args.yarn_correction_range_round_to_int)) if value is not None]
    # Megatron reads them only for a GPT's yarn; MLA's yarn takes MLATransformerConfig's values.
    require(not yarn_flags or (kind == "yarn" and not args.multi_latent_attention),
            f"{yarn_flags[0] if yarn_flags else ''} shapes --position-embedding-type yarn's angles (MLA's yarn "
            "keeps Megatron's defaults for it): add --position-embedding-type yarn, or drop it")
    if kind == "yarn":
        require(not args.multi_latent_attention, "--position-embedding-type yarn with --multi-latent-attention: "
                "MLA rotates its own channels (Megatron asserts no rope is passed in); choose MLA's with "
                "--rope-type yarn and --position-embedding-type rope")
        require(args.rotary_percent >= 1.0, f"--rotary-percent {args.rotary_percent:g} with --position-embedding-"
                "type yarn: Megatron's YaRN rotates all of a head's channels; drop --rotary-percent")


def validate_mla(args):
    """Multi-latent attention: Megatron's asserts, and what minitron's MLA does not do."""
    if args.rope_type is not None:    # Megatron: only MLA has a choice
        require(args.multi_latent_attention or args.rope_type == "rope", f"--rope-type {args.rope_type} is for "
                 "--multi-latent-attention; other attention uses plain rope: drop --rope-type")
    if not args.multi_latent_attention:
        require(args.q_lora_rank is None, "--q-lora-rank is for --multi-latent-attention: add it, or drop the rank")
        return
    require(not args.group_query_attention, "--multi-latent-attention excludes --group-query-attention "
             "(Megatron's rule: all heads already share one key/value latent): drop one")
    require(args.context_parallel_size == 1, "--multi-latent-attention with --context-parallel-size > 1: "
             "minitron's MLA does not cut its rope for context-parallel chunks; drop one")
    require(args.qk_pos_emb_head_dim % 2 == 0, f"--qk-pos-emb-head-dim {args.qk_pos_emb_head_dim} must be "
             "even: rope rotates channel pairs")
    tp = args.tensor_model_parallel_size
    for flag, size in (("--q-lora-rank", args.q_lora_rank),
                       ("--kv-lora-rank + --qk-pos-emb-head-dim", args.kv_lora_rank + args.qk_pos_emb_head_dim)):
        # The down projections are column-parallel (Megatron's local spec): whole columns per rank.
        require(size is None or size % tp == 0, f"{flag} ({size}) is not divisible by "
                 f"--tensor-model-parallel-size {tp}: the down projection splits its output columns")


_CP_NOT_BUILT = {"allgather": "all-gathers every key and value before attention"}


def validate_context_parallel(args):
    if isinstance(args.cp_comm_type, str):   # an older run's saved args (one kind, unlisted)
        args.cp_comm_type = [args.cp_comm_type]
    cp, kinds = args.context_parallel_size, args.cp_comm_type
    for kind in kinds:
        require(kind not in _CP_NOT_BUILT, f"--cp-comm-type {kind} ({_CP_NOT_BUILT.get(kind)}) is not built in "
                 "minitron: use p2p (the ring), a2a (all-to-all) or a2a+p2p")
    levels = args.hierarchical_context_parallel_sizes
    require(levels is None or math.prod(levels) == cp, f"--hierarchical-context-parallel-sizes "
             f"{' '.join(map(str, levels or ()))} must multiply to --context-parallel-size {cp}")
    # Megatron's rule; and its a2a+p2p takes exactly two levels: the all-to-all's, the ring's.
    require("a2a+p2p" not in kinds or (levels is not None and len(levels) == 2),
             "--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes A P (all-to-all groups of A, "
             "a ring of P of them; A x P = --context-parallel-size)")
    require(len(kinds) in (1, args.num_layers), f"--cp-comm-type takes one kind for every layer or one per layer "
             f"({args.num_layers}), got {len(kinds)}")
    if cp == 1:
        return
    heads = args.num_attention_heads // args.tensor_model_parallel_size
    require("a2a" not in kinds or heads % cp == 0,
             f"--cp-comm-type a2a gives each context-parallel rank whole heads: the {heads} heads of a "
             f"tensor-parallel rank do not split across --context-parallel-size {cp}")
    require("a2a+p2p" not in kinds or heads % levels[0] == 0,
             f"--cp-comm-type a2a+p2p gives each rank of an all-to-all group whole heads: the {heads} heads of a "
             f"tensor-parallel rank do not split across {levels[0] if levels else 0} (--hierarchical-context-parallel-sizes)")
    require(args.seq_length % (2 * cp) == 0,
             f"--seq-length {args.seq_length} must be a multiple of 2 x --context-parallel-size "
             f"= {2 * cp}: each sequence is cut into 2 x cp equal chunks")
    tp, local = args.tensor_model_parallel_size, args.seq_length // cp
    if args.sequence_parallel:
        require(local % tp == 0,
                 f"--sequence-parallel splits each context-parallel rank's {local} tokens across "
                 f"{tp} tensor-parallel ranks: make --seq-length a multiple of cp x tp = {cp * tp}")
    require(not args.reset_attention_mask,
             "--reset-attention-mask masks documents inside a sequence; context-parallel attention "
             "here is plain causal: drop one of --reset-attention-mask and --context-parallel-size")


def moe_training_refusal(args):
    """The one line a training step of these flags is refused with, or None.

    Megatron checks MoE against tensor parallelism late: its validate_args says nothing,
    ModelParallelConfig only warns (and only with expert parallelism too), and MoELayer.forward
    raises in training when tp > 1 without sequence parallelism, whatever ep is. The commands
    that start a training step (pretrain, trace --steps) or predict one (estimate) refuse it
    here, before any process starts, instead of at the first forward."""
    tp = args.tensor_model_parallel_size
    if args.num_experts is None or tp == 1 or args.sequence_parallel:
        return None
    return (f"MoE with --tensor-model-parallel-size {tp} trains only with --sequence-parallel: Megatron's MoE "
            "layer raises at its first training forward without it (each tensor-parallel rank must route its "
            "own part of the sequence); add --sequence-parallel")


def moe_setup_warning(args):
    """What an initialization-only run of the same flags prints instead, or None: Megatron's
    setup warning where it gives one (expert and tensor parallelism), and what training would meet."""
    if moe_training_refusal(args) is None:
        return None
    tp, ep = args.tensor_model_parallel_size, args.expert_model_parallel_size
    said = ("Megatron warns at setup that training with expert and tensor parallelism needs sequence "
            "parallelism" if ep > 1 else "Megatron says nothing at setup")
    return (f"warning: MoE at --tensor-model-parallel-size {tp} without --sequence-parallel: {said}; "
            "initialization runs, but a training step (--steps N) would be refused, as its MoE layer raises "
            "at the first forward: add --sequence-parallel")
