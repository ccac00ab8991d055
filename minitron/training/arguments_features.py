"""validate_args' checks of the model's optional features: the modern GPT options and
activation recomputation, context parallelism, and mixture of experts.

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


# Megatron's defaults for the MoE flags, filled in by validate_moe: the parser leaves them None
# so that a flag given to a dense model is refused rather than ignored.
MOE_DEFAULTS = {"moe_router_topk": 2, "moe_aux_loss_coeff": 0.0, "moe_layer_freq": 1}
# MoE flags whose default (None or off) says "not given": refused for a dense model too.
_MOE_ONLY = ("moe_ffn_hidden_size", "moe_expert_capacity_factor", "moe_pad_expert_input_to_capacity",
             "moe_router_pre_softmax", "moe_router_topk_scaling_factor", "moe_router_dtype", "moe_z_loss_coeff",
             "moe_router_enable_expert_bias", "moe_shared_expert_intermediate_size", "moe_grouped_gemm",
             "moe_router_num_groups", "moe_router_group_topk", "moe_router_force_load_balancing",
             "moe_apply_probs_on_input", "moe_latent_size")


def validate_moe(args):
    """Mixture of experts (Megatron's rules; --num-experts 0 was turned into None above)."""
    capacity = args.moe_expert_capacity_factor
    validate_mtp(args)
    if args.num_experts is None:
        given = [name for name in (*MOE_DEFAULTS, *_MOE_ONLY) if getattr(args, name) not in (None, False)]
        require(not given, f"--{given[0].replace('_', '-') if given else ''} is for a mixture of experts, and this "
                 "model has none: add --num-experts E, or drop it")
    for name, value in MOE_DEFAULTS.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.num_experts is None:
        return
    freq = args.moe_layer_freq
    require(not isinstance(freq, list) or (len(freq) == args.num_layers and any(freq)),
            f"--moe-layer-freq lists {len(freq) if isinstance(freq, list) else 0} layers, but the model has "
            f"--num-layers {args.num_layers}: one 0/1 per layer, at least one 1 (an MoE layer)")
    # Capacity (Megatron's token dropping, moe_utils.py; the parser keeps the factor above 0):
    # padding fills each expert up to it, so it needs one.
    require(not args.moe_pad_expert_input_to_capacity or capacity is not None,
             "--moe-pad-expert-input-to-capacity pads each expert's input to its capacity: give "
             "--moe-expert-capacity-factor F as well")
    e, k = args.num_experts, args.moe_router_topk
    require(k <= e, f"--moe-router-topk {k} is more than --num-experts {e}: a token cannot go to more "
             "experts than there are")
    tp = args.tensor_model_parallel_size
    # MoE at tp > 1 without --sequence-parallel is accepted here, as Megatron's validate_args
    # accepts it: a training step cannot run it (moe_training_refusal), initialization can.
    # --swiglu gates the experts too (moe/experts.py), their width moe_ffn_hidden_size each half.
    if args.moe_ffn_hidden_size is None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
    etp = args.expert_tensor_parallel_size
    # torch_dist keys each expert slice by its expert-tensor-parallel rank (transformer/utils.py),
    # so any etp saves and resumes; the legacy format's one file per (tp, pp, ep) rank is written
    # by one rank of each data-parallel group, whose expert slice is whole only when etp = tp.
    require(etp == tp or not (args.save and args.ckpt_format == "torch"),
             f"--ckpt-format torch keeps one file per (tensor, pipeline, expert) rank, which holds whole expert "
             f"slices only when --expert-tensor-parallel-size {etp} equals --tensor-model-parallel-size {tp}: "
             "use --ckpt-format torch_dist (Megatron's default)")
    require(args.moe_ffn_hidden_size % etp == 0,
             f"the experts' ffn size {args.moe_ffn_hidden_size} (--moe-ffn-hidden-size, default "
             f"--ffn-hidden-size) is not divisible by --expert-tensor-parallel-size {etp}")
    validate_moe_router(args)


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


# Flags that reach TransformerConfig under the same name (core_transformer_config_from_args).
MOE_CONFIG_FIELDS = ("moe_token_drop_policy", "moe_router_load_balancing_type", "moe_router_score_function",
                     "moe_router_pre_softmax", "moe_router_topk_scaling_factor", "moe_router_dtype",
                     "moe_z_loss_coeff", "moe_router_enable_expert_bias", "moe_router_bias_update_rate",
                     "moe_shared_expert_intermediate_size", "moe_token_dispatcher_type", "moe_grouped_gemm",
                     "moe_router_num_groups", "moe_router_group_topk", "moe_router_force_load_balancing",
                     "moe_apply_probs_on_input", "moe_latent_size",
                     "mtp_num_layers", "mtp_loss_scaling_factor")   # multi-token prediction's, with MoE's


def validate_moe_router(args):
    """The router's and the experts' options: Megatron's TransformerConfig rules, as one line each."""
    sinkhorn = args.moe_router_load_balancing_type == "sinkhorn"   # weighs top-1 by a sigmoid
    require(args.moe_router_topk > 1 or args.moe_router_score_function != "softmax" or args.moe_router_pre_softmax
            or sinkhorn,
            "--moe-router-topk 1 with a softmax after the top-k gives every token the weight 1 and the router "
            "no gradient: add --moe-router-pre-softmax (Megatron's rule)")
    require(not args.moe_router_enable_expert_bias or args.moe_router_score_function == "sigmoid",
            "--moe-router-enable-expert-bias biases the sigmoid scores: add --moe-router-score-function sigmoid")
    validate_moe_routing_extras(args)
    # A bias on an expert-tensor-parallel slice would be added once per slice (experts.py).
    etp = args.expert_tensor_parallel_size
    require(not args.add_bias_linear or etp == 1,
            f"experts have biases only with --expert-tensor-parallel-size 1 (Megatron's rule), got {etp}: "
            "add --disable-bias-linear, or --expert-tensor-parallel-size 1")
    require(args.moe_shared_expert_intermediate_size is None or not args.add_bias_linear,
            "--moe-shared-expert-intermediate-size: Megatron's shared experts have no biases; "
            "add --disable-bias-linear")
    shared = args.moe_shared_expert_intermediate_size
    # Megatron's MoELayer raises at a training forward: the overlap would run the shared expert
    # on the latent tokens the dispatcher sees, not on the h-wide ones it needs.
    require(args.moe_latent_size is None or "--moe-shared-expert-overlap" not in (args.no_effect or ()),
            "--moe-shared-expert-overlap with --moe-latent-size: Megatron's MoE layer refuses it in training; "
            "drop --moe-shared-expert-overlap")
    require(shared is None or shared % args.tensor_model_parallel_size == 0,
            f"--moe-shared-expert-intermediate-size {shared} is not divisible by --tensor-model-parallel-size "
            f"{args.tensor_model_parallel_size}: the shared expert is split like the dense MLP")


def validate_moe_routing_extras(args):
    """Group-limited routing, Sinkhorn, probabilities on the input (Megatron's rules, and the
    ones its code leaves to chance, marked minitron's)."""
    e, k, groups, group_k = args.num_experts, args.moe_router_topk, args.moe_router_num_groups, args.moe_router_group_topk
    require((groups is None) == (group_k is None),
            "group-limited routing takes --moe-router-num-groups G and --moe-router-group-topk N together "
            "(Megatron's rule for the second; the first alone would change nothing)")
    if groups is not None:
        require(e % groups == 0, f"--num-experts {e} is not divisible by --moe-router-num-groups {groups}")
        require(group_k <= groups, f"--moe-router-group-topk {group_k} is more than --moe-router-num-groups {groups}")
        # minitron's: a group scores the sum of its best k / N experts, and the final top-k must
        # fit in the N groups kept (else it picks masked experts, weight -inf)
        require(group_k <= k <= group_k * (e // groups),
                f"--moe-router-topk {k} must lie between --moe-router-group-topk {group_k} and the "
                f"{group_k * (e // groups)} experts of the {group_k} groups a token keeps")
    sinkhorn = args.moe_router_load_balancing_type == "sinkhorn"
    require(not sinkhorn or not args.moe_aux_loss_coeff,
            "--moe-router-load-balancing-type sinkhorn balances without a loss: drop --moe-aux-loss-coeff "
            "(Megatron's rule)")
    require(not sinkhorn or args.moe_expert_capacity_factor is None,
            "--moe-expert-capacity-factor drops tokens only after a loss-balanced or unbalanced choice, not "
            "Sinkhorn's: drop one of them (Megatron's rule)")
    require(not args.moe_apply_probs_on_input or k == 1,
            f"--moe-apply-probs-on-input scales the input of a token's one expert: it needs --moe-router-topk 1, "
            f"got {k} (Megatron's rule)")


def validate_mtp(args):
    """Multi-token prediction: Megatron's rule, and minitron's limit."""
    if not args.mtp_num_layers:
        return
    require(args.position_embedding_type in ("rope", "none"),
            f"--mtp-num-layers needs --position-embedding-type rope or none, got {args.position_embedding_type} "
            "(Megatron's rule: the MTP stage's embedding has no position table)")
    require(args.context_parallel_size == 1,
            "--mtp-num-layers rolls each sequence on one rank: minitron's MTP does not run with "
            "--context-parallel-size > 1")
    require(not getattr(args, "hybrid_layer_pattern", None),
            "--mtp-num-layers builds GPT's MTP layers; a hybrid model's (Megatron's MTP pattern after '/') are "
            "not built here: drop one")
