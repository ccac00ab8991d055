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

from minitron.trace import traced
# Megatron's arguments.py names core_transformer_config_from_args too (its home: argument_utils.py)
from minitron.training.argument_utils import core_transformer_config_from_args  # noqa: F401
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
from minitron.training.arguments_moe import validate_moe
from minitron.training.arguments_fp8 import validate_fp8
from minitron.training.arguments_layer import validate_layer_variants
from minitron.training.arguments_distributed import validate_layout
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
    validate_layout(args)
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
