"""Megatron's fp8 flags (training/argument_groups_fp8.py): what minitron builds, and one line
for each choice it cannot.

With ``--fp8-format`` the linear layers inside the transformer layers multiply with fp8 inputs
(core/fp8_utils.py, core/fp8/); without it the other fp8 flags are read by nobody, as in
Megatron. Nothing here imports torch.
"""

from __future__ import annotations

from minitron.training.argument_groups import require

# what core_transformer_config_from_args copies into the TransformerConfig
FP8_CONFIG_FIELDS = ("fp8", "fp8_recipe", "fp8_margin", "fp8_amax_history_len", "fp8_amax_compute_algo")

# --fp8-recipe choices Megatron offers and minitron does not build, and what each would need
_UNBUILT_RECIPES = {
    "mxfp8": "MXFP8 gives every 32 consecutive elements its own power-of-two (e8m0) scale, along the "
             "rows for one GEMM and along the columns for the transposed one; minitron's casts are per "
             "tensor: use --fp8-recipe delayed or tensorwise",
    "blockwise": "Float8BlockScaling scales 1x128 tiles of activations and 128x128 blocks of weights with "
                 "fp32 scales; minitron's casts are per tensor: use --fp8-recipe delayed or tensorwise",
    "custom": "it imports a quantizer factory written against Transformer Engine's classes, which minitron "
              "does not have: use --fp8-recipe delayed or tensorwise",
}


def validate_fp8(args) -> None:
    """What must hold between the fp8 flags and the others; one line each."""
    if not getattr(args, "fp8", None):
        return
    recipe = args.fp8_recipe
    require(recipe not in _UNBUILT_RECIPES,
            f"--fp8-recipe {recipe} is refused: {_UNBUILT_RECIPES.get(recipe)}")
    require(args.recompute_granularity != "full",
            "--fp8-format with --recompute-granularity full is refused: the recomputed forward must cast "
            "with the first forward's scales and leave the amax histories alone (TE's fp8 recompute), "
            "which minitron does not do; use --recompute-granularity selective")
    require(not getattr(args, "num_experts", None),
            "--fp8-format with --num-experts is refused: Megatron's experts run Transformer Engine's fp8 "
            "grouped GEMM, minitron's experts have no fp8 path; train the MoE model in --bf16")
    require(not getattr(args, "hybrid_layer_pattern", None),
            "--fp8-format with --hybrid-layer-pattern is refused: minitron's hybrid stack does not open the fp8 "
            "context that Megatron's opens around its Mamba and attention layers; train the hybrid model in --bf16")
