"""validate_args' checks of a mixture of experts: the MoE flags, the router's options, group-limited
and forced routing, and multi-token prediction's layers (which Megatron's MoE models carry).

Megatron keeps them in its one arguments.py and in TransformerConfig's __post_init__; here they
have a file of their own, beside arguments_features.py. Each check raises ArgumentError with one
line a user can act on, before any rank starts.
"""

from __future__ import annotations

from minitron.training.argument_groups import require

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
