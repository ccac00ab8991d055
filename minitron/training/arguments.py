"""Megatron's command line: parse_args, then validate_args derives what follows from it.

Flag names are Megatron's own (``--tensor-model-parallel-size``, ``--micro-batch-size``, ...),
so a launch script written for Megatron reads the same here. Like Megatron, the rank and world
size come from the environment (RANK / WORLD_SIZE, as torchrun sets them), not from flags.

validate_args is where the 3-D layout and the batch arithmetic are checked *before* any
process group exists: every inconsistent combination is reported as one line saying what is
wrong and what would fix it (``ArgumentError``).
"""

from __future__ import annotations

import argparse

from minitron.comm.comm import discover_world_info
from minitron.core.rank_generator import DEFAULT_ORDER, TP_PP_DP_ORDER
from minitron.training.argument_groups import ARGUMENT_GROUPS
from minitron.training.datasets.arguments import validate_data_args


class ArgumentError(ValueError):
    """A bad or inconsistent argument; the message is one line a user can act on."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse would print usage and exit(2); we want one clear line
        raise ArgumentError(message)


def build_parser(extra_args_provider=None) -> argparse.ArgumentParser:
    parser = _Parser(prog="pretrain_gpt", description="minitron arguments (Megatron's names)",
                     allow_abbrev=False)
    for add in ARGUMENT_GROUPS:
        add(parser)
    if extra_args_provider is not None:
        parser = extra_args_provider(parser)
    return parser


# --8<-- [start:parse-args]
def parse_args(extra_args_provider=None, ignore_unknown_args=False, argv=None):
    """Parse Megatron's flags; rank and world size come from the environment as in Megatron."""
    parser = build_parser(extra_args_provider)
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
# --8<-- [end:parse-args]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ArgumentError(message)


# --8<-- [start:validate-args]
def validate_args(args, defaults: dict | None = None):
    """Fill in what the flags imply and reject what cannot work. Returns args."""
    for key, value in (defaults or {}).items():
        if getattr(args, key, None) is None:  # a flag given on the command line wins
            setattr(args, key, value)

    for name in ("world_size", "tensor_model_parallel_size", "pipeline_model_parallel_size",
                 "context_parallel_size", "expert_model_parallel_size"):
        _require(getattr(args, name) >= 1, f"{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    for name in ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "micro_batch_size"):
        value = getattr(args, name)
        _require(value is not None, f"--{name.replace('_', '-')} is required")
        _require(value >= 1, f"--{name.replace('_', '-')} must be at least 1, got {value}")

    _validate_layout(args)
    _validate_model_shape(args)
    _validate_batch(args)
    _validate_training(args)

    _require(not (args.fp16 and args.bf16), "--fp16 and --bf16 exclude each other: choose one")
    args.params_dtype = "float16" if args.fp16 else "bfloat16" if args.bf16 else "float32"

    if args.distributed_backend is None:
        from minitron.accelerator import get_accelerator
        args.distributed_backend = get_accelerator().communication_backend_name()
    if args.distributed_backend == "nccl":
        import torch
        count = torch.cuda.device_count()
        _require(count > 0, "--distributed-backend nccl needs CUDA GPUs and none is visible; "
                 "use --distributed-backend gloo on CPU")
    _require(args.distributed_timeout_minutes >= 1, "--distributed-timeout-minutes must be at least 1")
    validate_data_args(args)
    return args
# --8<-- [end:validate-args]


# --8<-- [start:validate-layout]
def _validate_layout(args):
    tp, pp, cp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.context_parallel_size
    model = tp * pp * cp
    _require(args.world_size % model == 0,
             f"world size {args.world_size} is not divisible by tensor x pipeline x context parallel "
             f"= {tp} x {pp} x {cp} = {model}; choose sizes whose product divides {args.world_size}")
    args.data_parallel_size = args.world_size // model
    args.order = TP_PP_DP_ORDER if args.use_tp_pp_dp_mapping else DEFAULT_ORDER

    ep = args.expert_model_parallel_size
    if args.expert_tensor_parallel_size is None:
        args.expert_tensor_parallel_size = tp
    etp = args.expert_tensor_parallel_size
    _require(etp >= 1, f"--expert-tensor-parallel-size must be at least 1, got {etp}")
    expert_slice = args.world_size // (etp * pp) if args.world_size % (etp * pp) == 0 else None
    _require(expert_slice is not None and expert_slice % ep == 0,
             f"--expert-model-parallel-size {ep} must divide the expert data-parallel size "
             f"world / (expert tp x pp) = {args.world_size} / ({etp} x {pp})")
    args.expert_data_parallel_size = expert_slice // ep
    if args.use_tp_pp_dp_mapping and pp > 1:
        _require(args.expert_data_parallel_size == args.data_parallel_size,
                 "with --use-tp-pp-dp-mapping the expert and dense data-parallel sizes must match")
    if tp == 1:
        args.sequence_parallel = False  # as Megatron: nothing to split the sequence across

    # Virtual pipeline (interleaved schedule): several model chunks per pipeline rank.
    _require(args.num_layers % pp == 0,
             f"--num-layers {args.num_layers} is not divisible by --pipeline-model-parallel-size {pp}")
    per_stage = args.num_layers // pp
    if args.num_layers_per_virtual_pipeline_stage is not None:
        n = args.num_layers_per_virtual_pipeline_stage
        _require(n >= 1 and per_stage % n == 0,
                 f"the {per_stage} layers of each pipeline stage are not divisible by "
                 f"--num-layers-per-virtual-pipeline-stage {n}")
        args.virtual_pipeline_model_parallel_size = per_stage // n
    if args.virtual_pipeline_model_parallel_size is not None:
        vp = args.virtual_pipeline_model_parallel_size
        _require(pp > 1, "a virtual pipeline (interleaved schedule) needs --pipeline-model-parallel-size > 1")
        _require(vp >= 1 and args.num_layers % (pp * vp) == 0,
                 f"--num-layers {args.num_layers} is not divisible by pipeline x virtual pipeline "
                 f"= {pp} x {vp} = {pp * vp}")
        if vp == 1:
            args.virtual_pipeline_model_parallel_size = None  # one chunk per rank: no interleaving
# --8<-- [end:validate-layout]


def _validate_model_shape(args):
    tp = args.tensor_model_parallel_size
    heads = args.num_attention_heads
    _require(heads % tp == 0,
             f"--num-attention-heads {heads} is not divisible by --tensor-model-parallel-size {tp}: "
             f"each tensor-parallel rank computes whole heads")
    if args.kv_channels is None:
        _require(args.hidden_size % heads == 0,
                 f"--hidden-size {args.hidden_size} is not divisible by --num-attention-heads {heads}")
        args.kv_channels = args.hidden_size // heads
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = 4 * args.hidden_size
    _require(args.ffn_hidden_size % tp == 0,
             f"--ffn-hidden-size {args.ffn_hidden_size} is not divisible by --tensor-model-parallel-size {tp}")
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    _require(args.max_position_embeddings >= args.seq_length,
             f"--max-position-embeddings {args.max_position_embeddings} is shorter than "
             f"--seq-length {args.seq_length}")
    if args.sequence_parallel:
        _require(args.seq_length % tp == 0,
                 f"--sequence-parallel splits the sequence across tensor-parallel ranks: "
                 f"--seq-length {args.seq_length} must be divisible by {tp}")


# --8<-- [start:validate-batch]
def _validate_batch(args):
    micro, dp = args.micro_batch_size, args.data_parallel_size
    per_step = micro * dp
    if args.global_batch_size is None:
        args.global_batch_size = per_step
    _require(args.global_batch_size >= 1, f"--global-batch-size must be at least 1, got {args.global_batch_size}")
    if args.rampup_batch_size is None:
        _require(args.global_batch_size % per_step == 0,
                 f"--global-batch-size {args.global_batch_size} is not a multiple of micro batch x "
                 f"data-parallel size = {micro} x {dp} = {per_step}")
        return
    _require(len(args.rampup_batch_size) == 3,
             "--rampup-batch-size takes three numbers: START INCREMENT SAMPLES")
    try:
        start, increment, samples = (int(v) for v in args.rampup_batch_size)
    except ValueError:
        raise ArgumentError("--rampup-batch-size takes three integers: START INCREMENT SAMPLES") from None
    args.rampup_batch_size = [start, increment, samples]
    _require(start >= 1 and increment >= 1 and samples >= 0,
             "--rampup-batch-size needs START >= 1, INCREMENT >= 1 and SAMPLES >= 0")
    _require(args.global_batch_size > start and (args.global_batch_size - start) % increment == 0,
             f"--rampup-batch-size must climb from {start} to --global-batch-size "
             f"{args.global_batch_size} in whole steps of {increment}")
    _require(start % per_step == 0 and increment % per_step == 0,
             f"ramp-up batch sizes must stay multiples of micro batch x data-parallel size = {per_step}; "
             f"START {start} and INCREMENT {increment} are not")
# --8<-- [end:validate-batch]



def _validate_training(args):
    if not args.train_iters:
        return
    _require(args.train_iters >= 1, f"--train-iters must be at least 1, got {args.train_iters}")
    _require(args.lr is not None and args.lr >= 0, "--lr is required for training (e.g. --lr 1e-3)")
    _require(args.lr_warmup_fraction is None or args.lr_warmup_iters == 0,
             "give --lr-warmup-fraction or --lr-warmup-iters, not both")
    vp = args.virtual_pipeline_model_parallel_size
    pp = args.pipeline_model_parallel_size
    if vp is not None:
        num_micro = args.global_batch_size // (args.micro_batch_size * args.data_parallel_size)
        _require(num_micro % pp == 0,
                 f"the interleaved schedule needs the number of micro-batches ({num_micro} = global batch "
                 f"{args.global_batch_size} / (micro {args.micro_batch_size} x dp {args.data_parallel_size})) "
                 f"to be a multiple of --pipeline-model-parallel-size {pp}")
    if args.eval_interval is not None:
        _require(args.eval_interval >= 1 and args.eval_iters >= 1,
                 "--eval-interval needs --eval-iters N >= 1 (and an interval >= 1)")
    if args.save_interval is not None:
        _require(args.save is not None and args.save_interval >= 1,
                 "--save-interval N needs --save DIR (and N >= 1)")
    if args.load is not None:
        from minitron.training.checkpoint_files import CheckpointError, check_resumable  # torch-free
        try:
            check_resumable(args)
        except CheckpointError as exc:
            raise ArgumentError(str(exc)) from None


def core_transformer_config_from_args(args):
    """The model's TransformerConfig, read off the validated args (Megatron's helper of the
    same name): the command line describes the model once, the layers read the config."""
    import torch

    from minitron.core.transformer.transformer_config import TransformerConfig

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.params_dtype]
    return TransformerConfig(
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        sequence_parallel=args.sequence_parallel, params_dtype=dtype,
        num_layers=args.num_layers, hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads, ffn_hidden_size=args.ffn_hidden_size,
        kv_channels=args.kv_channels, hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout, layernorm_epsilon=args.layernorm_epsilon,
        init_method_std=args.init_method_std, init_seed=args.seed,
        pipeline_dtype=dtype,
    )
