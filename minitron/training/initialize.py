"""initialize_megatron: arguments -> globals -> process groups -> seeds, on every rank.

    initialize_megatron
    ├─ parse_args, validate_args      (no communication yet: errors are cheap here)
    ├─ set_global_variables
    └─ finish_mpu_init
       ├─ _initialize_distributed
       │  ├─ comm.init_distributed -> TorchBackend -> torch.distributed.init_process_group
       │  └─ parallel_state.initialize_model_parallel -> torch.distributed.new_group x N
       └─ _set_random_seed
"""

from __future__ import annotations

import random
from datetime import timedelta

import numpy as np
import torch

from minitron import comm
from minitron.accelerator import get_accelerator, set_accelerator_for_backend
from minitron.core import parallel_state as mpu
from minitron.core import tensor_parallel
from minitron.core.tensor_parallel import random as tensor_parallel_random
from minitron.trace import traced
from minitron.training.argument_groups_ci import apply_deterministic_mode
from minitron.training.arguments import parse_args, validate_args
from minitron.training.argument_groups_ckpt import setup_logging
from minitron.training.argument_groups_launch import apply_bf16_matmul_precision
from minitron.training.arguments_policy import no_effect_lines
from minitron.training.global_vars import get_args, set_global_variables
from minitron.training.utils import print_rank_0, print_to_console


@traced
def initialize_megatron(extra_args_provider=None, args_defaults=None, ignore_unknown_args=False,
                        argv=None):
    """Set up everything a rank needs before it builds a model."""
    args = parse_args(extra_args_provider, ignore_unknown_args, argv)
    validate_args(args, args_defaults or {})
    if args.rank == 0:   # where Megatron prints its arguments; the world is not joined yet
        for line in no_effect_lines(args):
            print_to_console(line)
    set_global_variables(args)
    setup_logging(args)   # --logging-level: Megatron's place, once the globals are set
    apply_bf16_matmul_precision(args)   # --disable-bf16-reduced-precision-matmul, before any matmul
    if args.deterministic_mode:   # before the world is joined: NCCL reads its variables then
        apply_deterministic_mode()
    finish_mpu_init()


@traced
def finish_mpu_init():
    """Megatron nests this inside initialize_megatron (so --lazy-mpu-init can defer it);
    we give it module level so the trace names it."""
    args = get_args()
    _initialize_distributed()
    print_rank_0(f"> initialized {args.world_size} ranks: tensor {args.tensor_model_parallel_size}, "
                 f"pipeline {args.pipeline_model_parallel_size}, context {args.context_parallel_size}, "
                 f"data {args.data_parallel_size}")
    _set_random_seed(args.seed, args.data_parallel_random_init)


@traced
def _initialize_distributed():
    """Join the world, then carve it into Megatron's groups."""
    args = get_args()
    # The backend decides where this rank computes: gloo and fake ranks on the CPU even where
    # GPUs exist (the launcher may have chosen CUDA while validating), nccl ranks on a GPU.
    set_accelerator_for_backend(args.distributed_backend)
    accelerator = get_accelerator()
    device_count = accelerator.device_count()
    if torch.distributed.is_initialized():
        # Someone (a test, a notebook) joined the world already: adopt its rank and size.
        args.rank = torch.distributed.get_rank()
        args.world_size = torch.distributed.get_world_size()
    else:
        if device_count > 0:
            accelerator.set_device(args.local_rank)  # one GPU per rank, chosen by LOCAL_RANK
        comm.init_distributed(
            dist_backend=args.distributed_backend,
            timeout=timedelta(minutes=args.distributed_timeout_minutes),
            rank=args.rank, world_size=args.world_size,
        )
    # Megatron builds groups only when device_count > 0; on CPU we always build them, since
    # that is the whole point of running the layout on gloo.
    if mpu.model_parallel_is_initialized():
        print("model parallel is already initialized", flush=True)
    else:
        mpu.initialize_model_parallel(
            args.tensor_model_parallel_size,
            args.pipeline_model_parallel_size,
            args.virtual_pipeline_model_parallel_size,
            context_parallel_size=args.context_parallel_size,
            expert_model_parallel_size=args.expert_model_parallel_size,
            expert_tensor_parallel_size=args.expert_tensor_parallel_size,
            distributed_timeout_minutes=args.distributed_timeout_minutes,
            order=args.order,
            hierarchical_context_parallel_sizes=args.hierarchical_context_parallel_sizes,
        )
    # Megatron-DeepSpeed's third step here (seed 002 calls it setting up ZeRO-R): configure
    # DeepSpeed's activation checkpoint, which the transformer block then uses for its chunks.
    if args.deepspeed and args.deepspeed_activation_checkpointing:
        setup_deepspeed_random_and_activation_checkpointing(args)
    else:   # a run in the same process before this one may have installed DeepSpeed's
        tensor_parallel_random.replace_checkpoint(None)


@traced
def setup_deepspeed_random_and_activation_checkpointing(args):
    """``deepspeed.checkpointing.configure`` with the ds_config's activation_checkpointing section,
    this run's count of checkpointed chunks where the section leaves number_checkpoints out (as
    Megatron-DeepSpeed computes it), and the tensor-parallel group to partition across. Nothing is
    partitioned yet: that happens in each checkpointed chunk's forward. Megatron-DeepSpeed also
    swaps in DeepSpeed's random-state tracker; minitron's checkpoints share its one tracker."""
    # lazy: only a DeepSpeed run with --deepspeed-activation-checkpointing reads these; the others
    # never load DeepSpeed's checkpoint or its ds_config section
    from minitron.runtime.activation_checkpointing import checkpointing
    from minitron.runtime.activation_checkpointing.config import parse_activation_checkpointing
    from minitron.runtime.config import load_config
    from minitron.training.deepspeed_activation_arguments import checkpoints_per_forward

    given = parse_activation_checkpointing(load_config(args.deepspeed_config))["number_checkpoints"]
    checkpointing.configure(mpu, deepspeed_config=args.deepspeed_config,
                            num_checkpoints=None if given is not None else checkpoints_per_forward(args))


def rank_seed(seed: int, data_parallel_random_init: bool = False) -> int:
    """This rank's seed: one per pipeline stage (each holds other layers), shared by the
    data-parallel replicas unless they are to start from different weights."""
    seed += 100 * mpu.get_pipeline_model_parallel_rank()
    if data_parallel_random_init:
        seed += 10 * mpu.get_data_parallel_rank()
    return seed


@traced
def _set_random_seed(seed_: int, data_parallel_random_init: bool = False):
    """Different pipeline stages get different seeds (they hold different layers); data-parallel
    replicas share one unless asked otherwise, so they start from identical weights."""
    seed = rank_seed(seed_, data_parallel_random_init)
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
    if get_accelerator().device_count() > 0:
        get_accelerator().manual_seed(seed)
    # The second stream: dropout inside tensor-parallel regions must differ across tp ranks
    # (each holds different activations), while dropout on replicated activations must agree.
    tensor_parallel.model_parallel_cuda_manual_seed(seed)
