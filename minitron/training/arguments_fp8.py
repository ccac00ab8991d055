"""Megatron's fp8 flags (training/argument_groups_fp8.py): what minitron builds, and one line
for each choice it cannot.

With ``--fp8-format`` the linear layers inside the transformer layers multiply with fp8 inputs
(core/fp8_utils.py, core/fp8/), the MoE experts' GEMMs too, each expert with scales of its own
(moe/experts.py); without it the other fp8 flags are read by nobody, as in
Megatron. Nothing here imports torch.
"""

from __future__ import annotations

from minitron.training.argument_groups import require

# what core_transformer_config_from_args copies into the TransformerConfig
FP8_CONFIG_FIELDS = ("fp8", "fp8_recipe", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo")

# --fp8-recipe choices Megatron offers and minitron does not build, and what each would need
_UNBUILT_RECIPES = {
    "blockwise": "Float8BlockScaling scales 1x128 tiles of activations and 128x128 blocks of weights with "
                 "fp32 scales; minitron's casts are per tensor: use --fp8-recipe delayed or tensorwise",
    "custom": "it imports a quantizer factory written against Transformer Engine's classes, which minitron "
              "does not have: use --fp8-recipe delayed or tensorwise",
}


def validate_fp8(args) -> None:
    """What must hold between the fp8 flags and the others; one line each."""
    _validate_fp8_param_gather(args)
    if not getattr(args, "fp8", None):
        return
    recipe = args.fp8_recipe
    require(recipe not in _UNBUILT_RECIPES,
            f"--fp8-recipe {recipe} is refused: {_UNBUILT_RECIPES.get(recipe)}")
    if recipe == "mxfp8":
        odd = [f"{name} {n}" for name, n in _gemm_dimensions(args) if n % 32]
        require(not odd, f"--fp8-recipe mxfp8 needs every GEMM dimension in whole 32-element blocks "
                         f"(TE's MXFP8 does too); not so: {', '.join(odd)}")
    require(args.recompute_granularity != "full",
            "--fp8-format with --recompute-granularity full is refused: the recomputed forward must cast "
            "with the first forward's scales and leave the amax histories alone (TE's fp8 recompute), "
            "which minitron does not do; use --recompute-granularity selective")
    require(not (getattr(args, "num_experts", None) and getattr(args, "moe_latent_size", None)),
            "--fp8-format with --moe-latent-size is refused: Megatron runs the two latent projections as "
            "TE linears in fp8, minitron's run in the training dtype; leave out --moe-latent-size or --fp8-format")
    require(not getattr(args, "hybrid_layer_pattern", None),
            "--fp8-format with --hybrid-layer-pattern is refused: minitron's hybrid stack does not open the fp8 "
            "context that Megatron's opens around its Mamba and attention layers; train the hybrid model in --bf16")


def _validate_fp8_param_gather(args) -> None:
    """--fp8-param-gather (core/fp8/param_gather.py): Megatron's rules, and what minitron lacks."""
    if not getattr(args, "fp8_param_gather", False):
        return
    require(getattr(args, "fp8", None), "--fp8-param-gather needs --fp8-format: it keeps the weights of the "
                                        "fp8 linears in fp8 (Megatron: fp8_param must be used with fp8)")
    require(args.use_distributed_optimizer or getattr(args, "use_megatron_fsdp", False),
            "--fp8-param-gather needs --use-distributed-optimizer or --use-megatron-fsdp: the fp8 weights are "
            "cast from their fp32 main shards and all-gathered as fp8 (Megatron's rule)")
    require(not (args.no_load_optim or getattr(args, "finetune", False)),
            "--fp8-param-gather with --no-load-optim or --finetune is refused: the checkpoint keeps the fp8 weights "
            "without their scales, so fp32 main weights cannot be rebuilt from them; load the optimizer state too")
    require(not getattr(args, "num_experts", None),
            "--fp8-param-gather with --num-experts is refused: the experts' weights would be fp8 parameters "
            "sharded over the expert-data-parallel group, which minitron's fp8 casts of the main shards do not "
            "cover; leave out --fp8-param-gather (the experts still multiply in fp8)")
    require(args.fp8_recipe != "mxfp8",
            "--fp8-param-gather with --fp8-recipe mxfp8 is refused: minitron keeps fp8 weights with one scale "
            "per tensor, MXFP8 weights need their 32-element blocks in both directions; use delayed or tensorwise")


def _gemm_dimensions(args) -> list[tuple[str, int]]:
    """What MXFP8 cuts into blocks of 32, per rank: the tokens of a micro-batch (a GEMM sums
    over them for the weight gradient; with sequence parallelism each rank casts its part) and
    the sizes of the quantized weights, as this rank holds them."""
    t, h = args.tensor_model_parallel_size, args.hidden_size
    tokens = args.seq_length // args.context_parallel_size * args.micro_batch_size
    ffn = args.ffn_hidden_size
    dims = [("tokens per micro-batch" + (" and tp rank" if args.sequence_parallel and t > 1 else ""),
             tokens // t if args.sequence_parallel and t > 1 else tokens),
            ("--hidden-size", h), ("--ffn-hidden-size / tp", ffn // t),
            ("the MLP's first output / tp", ffn * (2 if args.swiglu else 1) // t)]
    if args.multi_latent_attention:
        n, pe = args.num_attention_heads // t, args.qk_pos_emb_head_dim
        dims += [("--kv-lora-rank", args.kv_lora_rank),
                 ("(--kv-lora-rank + --qk-pos-emb-head-dim) / tp", (args.kv_lora_rank + pe) // t),
                 ("query heads x (qk + rope) dims / tp", n * (args.qk_head_dim + pe)),
                 ("heads x (qk + v) dims / tp", n * (args.qk_head_dim + args.v_head_dim)),
                 ("heads x --v-head-dim / tp", n * args.v_head_dim)]
        if args.q_lora_rank is not None:
            dims += [("--q-lora-rank", args.q_lora_rank), ("--q-lora-rank / tp", args.q_lora_rank // t)]
    else:
        groups = args.num_query_groups if args.group_query_attention else args.num_attention_heads
        dims += [("attention's width / tp", args.kv_channels * args.num_attention_heads // t),
                 ("linear_qkv's output / tp", args.kv_channels * (args.num_attention_heads + 2 * groups) // t)]
    if getattr(args, "num_experts", None):   # an expert's GEMMs: its rows are padded to 32s already
        etp, ffn = args.expert_tensor_parallel_size, args.moe_ffn_hidden_size
        dims += [("--moe-ffn-hidden-size / expert tp", ffn // etp),
                 ("an expert's first output / expert tp", ffn * (2 if args.swiglu else 1) // etp)]
    return dims
