"""validate_args' checks of the layer variants of newer GPTs: --add-qkv-bias (Qwen 2.5),
--squared-relu (Nemotron), and gpt-oss's --quick-geglu, GLU offset and clamp, and attention
sinks (--softmax-type). Megatron's rules, one line each, before any rank starts; torch-free.
"""

from __future__ import annotations

from minitron.training.argument_groups import require
from minitron.training.arguments_policy import note_no_effect


def validate_layer_variants(args):
    # Megatron keeps the two bias flags in step: all the linear biases include linear_qkv's.
    if args.add_bias_linear:
        args.add_qkv_bias = True
    for flag, on in (("--squared-relu", args.squared_relu), ("--quick-geglu", args.quick_geglu)):
        # Megatron asserts this while building the config: each names the MLP's one activation.
        require(not (on and args.swiglu), f"{flag} and --swiglu each choose the MLP's activation: keep one")
    require(not (args.squared_relu and args.quick_geglu),
            "--squared-relu and --quick-geglu each choose the MLP's activation: keep one")
    gated = args.swiglu or args.quick_geglu
    for flag, given in (("--glu-linear-offset", args.glu_linear_offset != 0.0),
                        ("--activation-func-clamp-value", args.activation_func_clamp_value is not None)):
        # Megatron reads both only inside its gated unit; elsewhere they would do nothing.
        require(not given or gated, f"{flag} shapes the gated MLP's unit: add --quick-geglu (gpt-oss) "
                "or --swiglu, or drop it")
    require(args.activation_func_clamp_value is None or args.activation_func_clamp_value > 0,
            f"--activation-func-clamp-value {args.activation_func_clamp_value}: must be > 0 (the up half is "
            "clamped to [-v, v])")
    require(not (args.bias_gelu_fusion and (args.squared_relu or args.quick_geglu)),
            "--bias-gelu-fusion fuses GeLU only (Megatron raises for another activation): drop it")
    if args.softmax_type != "vanilla":
        require(args.context_parallel_size == 1, f"--softmax-type {args.softmax_type} with --context-parallel-size "
                f"{args.context_parallel_size}: minitron's context-parallel attention has no sink column; drop one")
    # Llama 4's attention options
    if args.qk_l2_norm and args.qk_layernorm:
        # Megatron's layer specs (gpt_layer_specs.py, ModelOpt's model_specs.py) build the L2 norm
        # where both are asked for, as Llama-4 Scout's ModelOpt configuration does: no norm weights.
        args.qk_layernorm = False
        note_no_effect(args, "--qk-layernorm: --qk-l2-norm takes its place (Megatron's layer spec builds the L2 norm)")
    require(not (args.qk_l2_norm and args.multi_latent_attention),
            "--qk-l2-norm with --multi-latent-attention: Megatron asserts MLA has no L2 norm; drop one")
    freq = args.no_rope_freq
    if freq is not None:
        require(args.position_embedding_type in ("rope", "yarn") and not args.multi_latent_attention,
                f"--no-rope-freq skips rope on some layers, and this model's attention takes none from the model "
                f"(--position-embedding-type {args.position_embedding_type}"
                f"{', --multi-latent-attention' if args.multi_latent_attention else ''}): drop it")
        if isinstance(freq, int):
            require(args.num_layers % freq == 0, f"--no-rope-freq {freq} must divide --num-layers "
                    f"{args.num_layers} (Megatron's rule: the pattern repeats whole)")
        else:
            require(len(freq) == args.num_layers, f"--no-rope-freq lists {len(freq)} layers and --num-layers is "
                    f"{args.num_layers}: one 0/1 per layer")
