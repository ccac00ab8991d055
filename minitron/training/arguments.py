"""Megatron's command line: parse_args, then validate_args derives what follows from it.

Flag names are Megatron's own (``--tensor-model-parallel-size``, ``--micro-batch-size``, ...),
so a launch script written for Megatron reads the same here; they are declared in
argument_groups.py. Like Megatron, the rank and world size come from the environment
(RANK / WORLD_SIZE, as torchrun sets them), not from flags.

validate_args is where the 3-D layout and the batch arithmetic are checked *before* any
process group exists: every inconsistent combination is reported as one line saying what is
wrong and what would fix it (``ArgumentError``). Nothing on that path imports torch, so the
command line answers a bad layout in a fraction of a torch import.
"""

from __future__ import annotations

import glob
import os
from functools import lru_cache

from minitron.core.rank_generator import DEFAULT_ORDER, TP_PP_DP_ORDER, validate_parallel_sizes
from minitron.trace import traced
from minitron.training.argument_groups import ArgumentError, build_parser, require
from minitron.training.argument_groups_ci import validate_ci_args
from minitron.training.arguments_modelopt import apply_modelopt_flags
from minitron.training.argument_groups_ckpt import validate_ckpt_args
from minitron.training.argument_groups_fsdp import validate_fsdp_args
from minitron.training.argument_groups_torch_fsdp2 import validate_torch_fsdp2_args
from minitron.training.argument_groups_launch import validate_launch_args
from minitron.training.argument_groups_overlap import validate_overlap_args
from minitron.training.argument_groups_hybrid import validate_hybrid_args
from minitron.training.arguments_features import validate_context_parallel, validate_modern_options
from minitron.training.arguments_moe import MOE_CONFIG_FIELDS, validate_moe
from minitron.training.arguments_fp8 import FP8_CONFIG_FIELDS, validate_fp8
from minitron.training.arguments_layer import validate_layer_variants
from minitron.training.arguments_pipeline_split import uneven_split, validate_pipeline_split
from minitron.training.arguments_schedule import validate_batch, validate_lr_schedule, validate_run_length
from minitron.training.datasets.arguments import validate_data_args

__all__ = ["ArgumentError", "GPT_ARGS_DEFAULTS", "build_parser", "parse_args", "validate_args",
           "core_transformer_config_from_args"]

# The args_defaults pretrain_gpt.py passes to pretrain(): token ids over a small vocabulary, so
# a command line can stay about the parallel layout. They live here, not in pretrain_gpt.py,
# because the command line validates with them before it imports torch (pretrain_gpt does).
GPT_ARGS_DEFAULTS = {"tokenizer_type": "NullTokenizer", "vocab_size": 1024}


@lru_cache(maxsize=1)
def megatron_parser():
    """Megatron's flags as one parser, built once per process (~200 actions, a few ms): the
    command line builds it to validate, the ranks it forks inherit it, and a fake world's
    thousand ranks share it. Parsing leaves a parser as it was; never add flags to this one."""
    return build_parser()


@traced(args=lambda *a, **k: {})  # the traced chain shows parsing (its argv is not worth a line)
def parse_args(extra_args_provider=None, ignore_unknown_args=False, argv=None):
    """Parse Megatron's flags; rank and world size come from the environment as in Megatron."""
    # comm imports torch, and only a rank needs to know who it is: the command line validates
    # for the world it is about to start (cli/common.validate_pretrain) without calling this.
    from minitron.comm.comm import discover_world_info

    parser = build_parser(extra_args_provider) if extra_args_provider else megatron_parser()
    if ignore_unknown_args:
        args, _ = parser.parse_known_args(argv)
    else:
        args = parser.parse_args(argv)
    world = discover_world_info()  # torchrun's variables, else Slurm's or MPI's
    args.rank = world.rank
    args.world_size = world.world_size
    if args.local_rank is None:
        args.local_rank = world.local_rank
    return args


@traced(args=lambda args, *a, **k: {"world_size": args.world_size})  # the traced chain shows validation
def validate_args(args, defaults: dict | None = None):
    """Fill in what the flags imply and reject what cannot work. Returns args.

    Each number's own range was checked while parsing (argument_groups); what is left here
    is what must hold *between* flags."""
    for key, value in (defaults or {}).items():
        if getattr(args, key, None) is None:  # a flag given on the command line wins
            setattr(args, key, value)

    require(args.world_size >= 1, f"the world size must be at least 1, got {args.world_size}")
    validate_hybrid_args(args)   # first: a hybrid pattern sets --num-layers (and the virtual pipeline)
    for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size"):
        require(getattr(args, name) is not None, f"--{name.replace('_', '-')} is required")

    validate_ci_args(args)   # first: --moe-layer-recompute switches on what validate_modern_options checks
    apply_modelopt_flags(args)   # first too: --enable-gpt-oss chooses the position embedding checked below
    _validate_layout(args)
    validate_modern_options(args)
    validate_layer_variants(args)
    _validate_model_shape(args)
    validate_moe(args)
    validate_batch(args)
    require(not (args.fp16 and args.bf16), "--fp16 and --bf16 exclude each other: choose one")
    args.params_dtype = "float16" if args.fp16 else "bfloat16" if args.bf16 else "float32"
    # --8<-- [start:grad-reduce-dtype]
    require(not (args.grad_reduce_in_bf16 and args.accumulate_allreduce_grads_in_fp32),
            "--grad-reduce-in-bf16 and --accumulate-allreduce-grads-in-fp32 exclude each other: choose one")
    if args.bf16 and not args.grad_reduce_in_bf16:
        # Megatron's default for bf16: accumulate and reduce gradients in fp32. bf16 keeps 7 bits
        # of mantissa, so summing many micro-batches' or replicas' gradients in it loses the small
        # ones; --grad-reduce-in-bf16 trades that for half the buffer and half the traffic.
        # (fp16 keeps its 16-bit buffer unless asked: its loss scale already guards small values.)
        args.accumulate_allreduce_grads_in_fp32 = True
    # --8<-- [end:grad-reduce-dtype]
    # Megatron's two rules for the overlapped all-gather: only sharded parameters are gathered,
    # and they are gathered by the buckets that overlap_grad_reduce cuts.
    require(not args.overlap_param_gather or args.use_distributed_optimizer,
            "--overlap-param-gather gathers the distributed optimizer's shards: add --use-distributed-optimizer")
    require(not args.overlap_param_gather or args.overlap_grad_reduce,
            "--overlap-param-gather works bucket by bucket: add --overlap-grad-reduce")
    validate_launch_args(args)
    validate_overlap_args(args)
    validate_fsdp_args(args)
    validate_torch_fsdp2_args(args)
    validate_ckpt_args(args)   # before _validate_training: --finetune decides what a --load reads
    _validate_training(args)  # last: a --load is compared with every shape and dtype set above
    validate_context_parallel(args)
    validate_fp8(args)

    # --deepspeed (Megatron-DeepSpeed's path): the ds_config must agree with the flags above.
    from minitron.training.deepspeed_arguments import validate_deepspeed_args
    validate_deepspeed_args(args)

    if args.distributed_backend is None:
        # The accelerator asks torch whether a GPU is there: a rank's question, asked after
        # every refusal above (the command line passes the backend it chose).
        from minitron.accelerator import get_accelerator
        args.distributed_backend = get_accelerator().communication_backend_name()
    if args.distributed_backend == "nccl":
        no_gpu = ("--distributed-backend nccl needs CUDA GPUs and none is visible; use --distributed-backend "
                  "gloo on CPU")
        require(gpus_possible(), no_gpu)  # without torch, when the machine plainly has none
        import torch  # only nccl needs to count GPUs; gloo and fake runs never pay for it here
        require(torch.cuda.device_count() > 0, no_gpu)
    validate_data_args(args)
    return args


def gpus_possible() -> bool:
    """False when torch certainly finds no GPU here: no NVIDIA or AMD device node, or
    CUDA_VISIBLE_DEVICES hides them all. Asked before ``import torch`` (seconds), so that a
    GPU-less machine refuses nccl at once; True means only "ask torch"."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() in ("", "-1"):
        return False
    return bool(glob.glob("/dev/nvidia[0-9]*") or os.path.exists("/dev/kfd") or os.path.exists("/dev/dxg"))


def _validate_layout(args):
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    args.order = TP_PP_DP_ORDER if args.use_tp_pp_dp_mapping else DEFAULT_ORDER
    ep = args.expert_model_parallel_size
    if args.num_experts == 0:
        args.num_experts = None  # as Megatron: zero experts is a dense model
    if ep > 1:  # Megatron's condition: expert parallelism splits experts, so there must be some
        require(args.num_experts is not None,
                 f"--expert-model-parallel-size {ep} spreads experts over ranks, but there are none: "
                 f"add --num-experts N (a multiple of {ep})")
        require(args.num_experts % ep == 0,
                 f"--num-experts {args.num_experts} is not a multiple of --expert-model-parallel-size {ep}")

    # Virtual pipeline (interleaved schedule): several model chunks per pipeline rank.
    uneven = uneven_split(args)   # an uneven split is checked, whole, by validate_pipeline_split below
    require(args.num_layers % pp == 0 or args.hybrid_layer_pattern is not None or uneven,   # '|' may cut unevenly
             f"--num-layers {args.num_layers} is not divisible by --pipeline-model-parallel-size {pp}")
    if args.num_layers_per_virtual_pipeline_stage is not None:
        n = args.num_layers_per_virtual_pipeline_stage   # the embedding / loss may count as layers (Megatron)
        per_stage = (args.num_layers + args.account_for_embedding_in_pipeline_split
                     + args.account_for_loss_in_pipeline_split) // pp
        require(args.virtual_pipeline_model_parallel_size is None,
                 "give --num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank, "
                 "not both")
        require(per_stage % n == 0, f"the {per_stage} layers of each pipeline stage are not divisible by "
                 f"--num-layers-per-virtual-pipeline-stage {n}")
        args.virtual_pipeline_model_parallel_size = per_stage // n
    vp = args.virtual_pipeline_model_parallel_size

    # How the sizes tile the world: the rules' one home, shared with `minitron groups` and
    # initialize_model_parallel.
    try:
        sizes = validate_parallel_sizes(args.world_size, tp, pp, cp, ep, args.expert_tensor_parallel_size, vp,
                                        args.order)
    except ValueError as exc:
        raise ArgumentError(str(exc)) from None
    args.data_parallel_size = sizes["dp"]
    args.expert_tensor_parallel_size, args.expert_data_parallel_size = sizes["expert_tp"], sizes["expert_dp"]
    if tp == 1:
        args.sequence_parallel = False  # as Megatron: nothing to split the sequence across
    if vp is not None:
        require(args.num_layers % (pp * vp) == 0 or args.hybrid_layer_pattern is not None or uneven,
                 f"--num-layers {args.num_layers} is not divisible by pipeline x virtual pipeline "
                 f"= {pp} x {vp} = {pp * vp}")
        if vp == 1:
            args.virtual_pipeline_model_parallel_size = None  # one chunk per rank: no interleaving
    if uneven:
        validate_pipeline_split(args)


def _validate_model_shape(args):
    tp = args.tensor_model_parallel_size
    heads = args.num_attention_heads
    require(heads % tp == 0,
             f"--num-attention-heads {heads} is not divisible by --tensor-model-parallel-size {tp}: "
             f"each tensor-parallel rank computes whole heads")
    if args.kv_channels is None:
        require(args.hidden_size % heads == 0,
                 f"--hidden-size {args.hidden_size} is not divisible by --num-attention-heads {heads}")
        args.kv_channels = args.hidden_size // heads
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = 4 * args.hidden_size
    require(args.ffn_hidden_size % tp == 0,
             f"--ffn-hidden-size {args.ffn_hidden_size} is not divisible by --tensor-model-parallel-size {tp}")
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    require(args.max_position_embeddings >= args.seq_length,
             f"--max-position-embeddings {args.max_position_embeddings} is shorter than "
             f"--seq-length {args.seq_length}")
    if args.sequence_parallel:
        require(args.seq_length % tp == 0,
                 f"--sequence-parallel splits the sequence across tensor-parallel ranks: "
                 f"--seq-length {args.seq_length} must be divisible by {tp}")


def _validate_training(args):
    validate_run_length(args)
    if not args.train_iters:
        return  # initialization only (what `minitron trace` runs)
    validate_lr_schedule(args)
    vp = args.virtual_pipeline_model_parallel_size
    pp = args.pipeline_model_parallel_size
    if vp is not None:   # Megatron's group-size rules for the interleaved schedule's table
        from minitron.core.pipeline_parallel.pp_rank_microbatches import check_microbatch_group_size  # torch-free
        if args.microbatch_group_size_per_vp_stage is None:
            args.microbatch_group_size_per_vp_stage = pp
        num_micro = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
        problem = check_microbatch_group_size(num_micro, pp, args.microbatch_group_size_per_vp_stage)
        require(problem is None, f"the interleaved schedule's {num_micro} micro-batches (global batch "
                f"{args.global_batch_size} / (micro {args.micro_batch_size} x dp {args.data_parallel_size})): {problem}")
    # As Megatron: --eval-interval with --eval-iters 0 runs no validation, and --save-interval
    # without --save saves nothing (CI configs give both to switch the one off; train() reads them so).
    if args.ckpt_convert_format is not None:
        require(args.load is not None and args.ckpt_convert_save is not None,
                f"--ckpt-convert-format {args.ckpt_convert_format} converts a checkpoint: give --load DIR (what to "
                f"convert) and --ckpt-convert-save DIR (where)")
    if args.load is not None:
        # torch-free: a --load is checked here, before any rank starts
        from minitron.training.checkpoint_resume import CheckpointError, check_resumable  # torch-free
        try:
            check_resumable(args)
        except CheckpointError as exc:
            raise ArgumentError(str(exc)) from None


def _activation_func(args):
    """The MLP's activation, as Megatron's core_transformer_config_from_args picks it."""
    # lazy: parse_args and validate_args run without torch (above); only a rank's config needs these
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
