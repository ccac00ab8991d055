"""From validated args to the model's TransformerConfig: core_transformer_config_from_args.

Megatron-Core 0.19 keeps it in megatron/training/argument_utils.py (arguments.py imports it from
there, and pretrain_gpt.py asks arguments.py); so do we. It runs in the ranks only, where torch
is loaded anyway: the command line validates (arguments.py) without ever importing this module's
torch.
"""

from __future__ import annotations

from minitron.training.arguments_fp8 import FP8_CONFIG_FIELDS
from minitron.training.arguments_moe import MOE_CONFIG_FIELDS


def _activation_func(args):
    """The MLP's activation, as Megatron's core_transformer_config_from_args picks it."""
    # lazy: parse_args and validate_args (arguments.py) run without torch; only a rank's config needs these
    import torch

    from minitron.core.activations import quick_gelu, squared_relu
    if args.squared_relu:
        return squared_relu
    if args.quick_geglu:
        return quick_gelu
    return torch.nn.functional.silu if args.swiglu else torch.nn.functional.gelu


def _yarn_config_fields(args) -> dict:
    """A GPT's YaRN (not MLA's): the config.yarn_* fields, as Megatron's training sets them only
    for --position-embedding-type yarn (other configs keep the defaults, which change nothing)."""
    if args.position_embedding_type != "yarn" or args.multi_latent_attention:
        return {}
    given = {"yarn_rotary_scaling_factor": args.rotary_scaling_factor, "yarn_mscale": args.mscale,
             "yarn_mscale_all_dim": args.mscale_all_dim,
             "yarn_original_max_position_embeddings": args.yarn_original_max_position_embeddings,
             "yarn_beta_fast": args.yarn_beta_fast, "yarn_beta_slow": args.yarn_beta_slow,
             "yarn_correction_range_round_to_int": args.yarn_correction_range_round_to_int}
    return {name: value for name, value in given.items() if value is not None}


def core_transformer_config_from_args(args):
    """The model's TransformerConfig, read off the validated args (Megatron's helper of the
    same name): the command line describes the model once, the layers read the config."""
    # Called in ranks only, where torch is loaded anyway; at module level it would make every
    # validation on the command line pay for a torch import.
    import torch

    from minitron.core.transformer.transformer_config import TransformerConfig

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.params_dtype]
    return TransformerConfig(
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        microbatch_group_size_per_vp_stage=args.microbatch_group_size_per_vp_stage,
        num_layers_in_first_pipeline_stage=args.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=args.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=args.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=args.account_for_loss_in_pipeline_split,
        pipeline_model_parallel_layout=args.pipeline_model_parallel_layout,
        sequence_parallel=args.sequence_parallel, params_dtype=dtype,
        num_layers=args.num_layers, hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads, ffn_hidden_size=args.ffn_hidden_size,
        kv_channels=args.kv_channels, hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout, layernorm_epsilon=args.layernorm_epsilon,
        layernorm_zero_centered_gamma=args.layernorm_zero_centered_gamma,
        add_bias_linear=args.add_bias_linear, qk_layernorm=args.qk_layernorm,
        window_size=args.window_size, window_attn_skip_freq=args.window_attn_skip_freq,
        init_method_std=args.init_method_std, init_seed=args.seed,
        use_cpu_initialization=args.use_cpu_initialization,
        pipeline_dtype=dtype, calculate_per_token_loss=args.calculate_per_token_loss,
        # the modern GPT options and activation recomputation
        normalization=args.normalization, gated_linear_unit=args.swiglu or args.quick_geglu,
        activation_func=_activation_func(args), add_qkv_bias=args.add_qkv_bias, softmax_type=args.softmax_type,
        apply_query_key_layer_scaling=args.apply_query_key_layer_scaling,
        glu_linear_offset=args.glu_linear_offset, activation_func_clamp_value=args.activation_func_clamp_value,
        qk_l2_norm=args.qk_l2_norm, no_rope_freq=args.no_rope_freq,
        num_query_groups=args.num_query_groups if args.group_query_attention else None,
        rotary_interleaved=args.rotary_interleaved,
        cp_comm_type=args.cp_comm_type[0] if len(args.cp_comm_type) == 1 else list(args.cp_comm_type),
        recompute_granularity=args.recompute_granularity, recompute_method=args.recompute_method,
        recompute_num_layers=args.recompute_num_layers, recompute_modules=args.recompute_modules,
        # Megatron's fusions, opt-in; the activation's follows --swiglu, as Megatron maps it
        bias_activation_fusion=args.bias_swiglu_fusion if args.swiglu else args.bias_gelu_fusion,
        bias_dropout_fusion=args.bias_dropout_fusion, cross_entropy_loss_fusion=args.cross_entropy_loss_fusion,
        # multi-latent attention
        multi_latent_attention=args.multi_latent_attention, q_lora_rank=args.q_lora_rank,
        kv_lora_rank=args.kv_lora_rank, qk_head_dim=args.qk_head_dim,
        qk_pos_emb_head_dim=args.qk_pos_emb_head_dim, v_head_dim=args.v_head_dim,
        rope_type=args.rope_type or "yarn", rotary_base=args.rotary_base, rotary_percent=args.rotary_percent,
        rotary_scaling_factor=args.rotary_scaling_factor, mscale=args.mscale, mscale_all_dim=args.mscale_all_dim,
        **_yarn_config_fields(args),
        # mixture of experts
        num_moe_experts=args.num_experts, moe_router_topk=args.moe_router_topk,
        moe_aux_loss_coeff=args.moe_aux_loss_coeff, moe_layer_freq=args.moe_layer_freq,
        moe_ffn_hidden_size=args.moe_ffn_hidden_size,
        moe_expert_capacity_factor=args.moe_expert_capacity_factor,
        moe_pad_expert_input_to_capacity=args.moe_pad_expert_input_to_capacity,
        **{name: getattr(args, name) for name in MOE_CONFIG_FIELDS},
        **{name: getattr(args, name) for name in FP8_CONFIG_FIELDS},
        expert_model_parallel_size=args.expert_model_parallel_size,
        expert_tensor_parallel_size=args.expert_tensor_parallel_size,
        # a hybrid model's Mamba layers (core/ssm/), as Megatron sets them from its flags
        is_hybrid_model=args.hybrid_layer_pattern is not None, mamba_state_dim=args.mamba_state_dim,
        mamba_head_dim=args.mamba_head_dim, mamba_num_groups=args.mamba_num_groups,
        mamba_num_heads=args.mamba_num_heads,
    )
