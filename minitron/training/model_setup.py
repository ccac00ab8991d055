"""setup_model_and_optimizer: this rank's model chunks, wrapped for data parallelism, and the
optimizer and learning-rate schedule over their parameters.

Megatron keeps these in training.py; they have their own file here so training.py reads as
the loop alone.

DDP, the optimizers and the schedule are imported inside the functions that build them:
``minitron trace`` imports this module (through pretrain) but, initializing only, builds no
model, and they are about 0.1 s of imports it would pay before every trace.
"""

from __future__ import annotations

from contextlib import ExitStack, contextmanager

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state as mpu
from minitron.core.init_rng import build_on_meta
from minitron.core.pipeline_parallel.schedules import get_model_config
from minitron.core.transformer.module import Float16Module
from minitron.trace import traced
from minitron.training.checkpointing import convert_checkpoint, load_checkpoint
from minitron.training.global_vars import get_args
from minitron.training.training_log import print_parameter_count


def _chunk_builder(model_provider_func, vp_stage):
    """build(keep) -> the chunk of ``vp_stage``; ``keep`` (core/init_rng.build_on_meta) makes
    the layers it does not admit shapes only; None builds everything. Every build after the
    first starts from the host generator's state the first one started from, so that what is
    drawn outside the layers' own seeds is drawn again alike."""
    start = []

    def build(keep=None):
        with ExitStack() as stack:
            if start:
                stack.enter_context(torch.random.fork_rng(devices=[]))
                torch.set_rng_state(start[0])
            else:
                start.append(torch.get_rng_state())
            if keep is not None:
                stack.enter_context(build_on_meta(keep))
            return model_provider_func(pre_process=mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage),
                                       post_process=mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage),
                                       vp_stage=vp_stage)
    return build


@traced
def get_model(model_provider_func, model_type, wrap_with_ddp: bool = True):
    """Build the part of the model this rank holds: one chunk, or one per virtual stage.

    Each chunk is told whether it is the first stage (it owns the embedding and reads tokens)
    and the last (it owns the output layer and computes the loss). Everything else about the
    split — which layers, which slice of each weight — the model derives from parallel_state.
    """
    args = get_args()
    vp = mpu.get_virtual_pipeline_model_parallel_world_size()
    builders = [_chunk_builder(model_provider_func, chunk if vp is not None else None) for chunk in range(vp or 1)]
    # --init-model-with-meta-device: shapes only; Megatron-FSDP then builds each unit for real,
    # alone, and keeps this rank's shard of it (core/distributed/fsdp/meta_init.py).
    meta = getattr(args, "init_model_with_meta_device", False)
    model = [build(keep=(lambda index: False) if meta else None) for build in builders]
    print_parameter_count(model)
    # Megatron's GPU allocation: every chunk goes to this rank's device before it is cast or
    # wrapped, so DDP's buffers and the optimizer's fp32 copies are made there too. Weights
    # drawn on the device (a GPU rank without --use-cpu-initialization) are there already; on
    # a CPU rank the device is the CPU and nothing moves.
    device = get_accelerator().current_device_name()
    model = [chunk if meta else chunk.to(device) for chunk in model]
    if (args.fp16 or args.bf16) and not args.deepspeed:
        # Megatron's order: count, then cast (Float16Module), then wrap for data parallelism,
        # so DDP's gradient buffers are made for the 16-bit parameters. Under --deepspeed the
        # engine casts the bare module itself (as DeepSpeed does), and ZeRO-3 must see the
        # GPTModel to register its tied output weight.
        model = [Float16Module(chunk.config, chunk) for chunk in model]
    if getattr(args, "fp8_param_gather", False):   # Megatron builds these layers under fp8_model_init
        # lazy, as DDP below: `minitron trace` loads this module and builds no model
        from minitron.core.fp8.param_gather import keep_fp8_params
        for chunk in model:
            keep_fp8_params(chunk, chunk.config)
    if not wrap_with_ddp:
        return model
    if args.use_megatron_fsdp:   # Megatron-FSDP wraps each chunk instead of DDP (core/distributed/fsdp)
        # lazy, as DDP below: `minitron trace` loads this module and builds no model
        from minitron.core.distributed.fsdp import FullyShardedDataParallel
        return [FullyShardedDataParallel(chunk.config, chunk, args.data_parallel_sharding_strategy,
                                         args.data_parallel_random_init, args.accumulate_allreduce_grads_in_fp32,
                                         rebuild=build if meta else None,
                                         main_params_dtype=args.megatron_fsdp_main_params_dtype,
                                         main_grads_dtype=args.megatron_fsdp_main_grads_dtype,
                                         grad_comm_dtype=args.megatron_fsdp_grad_comm_dtype,
                                         bucket_size=args.ddp_bucket_size, overlap_grad_reduce=args.overlap_grad_reduce,
                                         disable_bucketing=i > 0)
                for i, (chunk, build) in enumerate(zip(model, builders))]
    if args.use_torch_fsdp2:   # torch's own FSDP2 wraps each chunk instead (Megatron's torch_FSDP)
        # lazy, as DDP below; and torch.distributed.tensor, which it loads, costs seconds
        from minitron.core.distributed.torch_fully_sharded_data_parallel import TorchFullyShardedDataParallel
        return [TorchFullyShardedDataParallel(chunk.config, chunk, args.torch_fsdp2_reshard_after_forward,
                                              args.data_parallel_random_init) for chunk in model]
    # Imported here, not at the top: `minitron trace` loads this module and builds no model.
    from minitron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp_config = DistributedDataParallelConfig(
        grad_reduce_in_fp32=args.accumulate_allreduce_grads_in_fp32,
        overlap_grad_reduce=args.overlap_grad_reduce, overlap_param_gather=args.overlap_param_gather,
        use_distributed_optimizer=args.use_distributed_optimizer, bucket_size=args.ddp_bucket_size,
        check_for_nan_in_grad=args.check_for_nan_in_loss_and_grad)
    # Megatron buckets the first model chunk only: with virtual stages the other chunks'
    # reductions run while the first chunk still computes (DDP also skips stages after the first).
    wrapped = [DistributedDataParallel(chunk.config, ddp_config, chunk, disable_bucketing=index > 0)
               for index, chunk in enumerate(model)]
    if args.data_parallel_random_init:
        # Replicas seeded differently drew different weights: make rank 0's everyone's.
        for chunk in wrapped:
            chunk.broadcast_params()
    return wrapped


def get_optimizer_param_scheduler(optimizer):
    """Megatron's schedule arithmetic: steps are counted in samples, not iterations."""
    # Lazy: no model, no schedule (see the module docstring).
    from minitron.core.optimizer_param_scheduler import OptimizerParamScheduler

    args = get_args()
    if args.train_samples:   # sample-based: the --lr-*-samples flags are the steps themselves
        decay_steps = args.lr_decay_samples or args.train_samples
        wd_incr_steps = args.train_samples
        wsd_decay_steps = args.lr_wsd_decay_samples
        warmup_steps = args.lr_warmup_samples
    else:                    # iteration-based: an iteration is a global batch of samples
        gbs = args.global_batch_size
        decay_steps = (args.lr_decay_iters or args.train_iters) * gbs
        wd_incr_steps = args.train_iters * gbs
        wsd_decay_steps = args.lr_wsd_decay_iters * gbs if args.lr_wsd_decay_iters is not None else None
        warmup_steps = args.lr_warmup_iters * gbs
    if args.lr_warmup_fraction is not None:
        warmup_steps = args.lr_warmup_fraction * decay_steps   # a float, as in Megatron
    return OptimizerParamScheduler(
        optimizer, init_lr=args.lr_warmup_init, max_lr=args.lr, min_lr=args.min_lr,
        lr_warmup_steps=warmup_steps, lr_decay_steps=decay_steps, lr_decay_style=args.lr_decay_style,
        start_wd=args.weight_decay, end_wd=args.weight_decay,
        wd_incr_steps=wd_incr_steps, wd_incr_style="constant",
        wsd_decay_steps=wsd_decay_steps, lr_wsd_decay_style=args.lr_wsd_decay_style,
        use_checkpoint_opt_param_scheduler=args.use_checkpoint_opt_param_scheduler,
        override_opt_param_scheduler=args.override_opt_param_scheduler)


@traced
def setup_model_and_optimizer(model_provider_func, model_type):
    # Lazy: no model, no optimizer (see the module docstring).
    from minitron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    args = get_args()
    model = get_model(model_provider_func, model_type)
    config = OptimizerConfig(
        optimizer=args.optimizer, lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
        decoupled_lr=args.decoupled_lr, decoupled_min_lr=args.decoupled_min_lr,
        adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
        sgd_momentum=args.sgd_momentum, fp16=args.fp16, bf16=args.bf16,
        loss_scale=args.loss_scale, initial_loss_scale=args.initial_loss_scale,
        min_loss_scale=args.min_loss_scale, loss_scale_window=args.loss_scale_window,
        hysteresis=args.hysteresis, clip_grad=args.clip_grad,
        use_distributed_optimizer=args.use_distributed_optimizer, log_num_zeros_in_grad=args.log_num_zeros_in_grad)
    if args.use_megatron_fsdp:   # torch's optimizer over this rank's shards (core/distributed/fsdp)
        # lazy: no model, no optimizer (see the module docstring)
        from minitron.core.distributed.fsdp import get_fsdp_optimizer as get_megatron_optimizer
    optimizer = get_megatron_optimizer(config, model)
    opt_param_scheduler = get_optimizer_param_scheduler(optimizer)

    # The schedules reach the optimizer and DDP through the model's config, as in Megatron.
    model_config = get_model_config(model[0])
    model_config.grad_scale_func = optimizer.scale_loss
    model_config.no_sync_func = model[0].no_sync if len(model) == 1 else _no_sync_all(model)
    # lazy, as DDP in get_model; from the submodule itself: once anything has imported the
    # submodule, the package's name finalize_model_grads means the module, not the function
    from minitron.core.distributed.finalize_model_grads import finalize_model_grads
    model_config.finalize_model_grads_func = finalize_model_grads
    args.iteration = 0
    args.consumed_train_samples = 0
    if args.load is not None:
        args.iteration = load_checkpoint(model, optimizer, opt_param_scheduler)
        if args.iteration and getattr(args, "fp8_param_gather", False):
            optimizer.reload_fp8_params()   # the fp8 weights' scales are not in the checkpoint
    if args.ckpt_convert_format is not None:   # Megatron's conversion: what was loaded, saved again
        convert_checkpoint(model, optimizer, opt_param_scheduler)
    return model, optimizer, opt_param_scheduler


def _no_sync_all(model):
    """One no_sync context over every chunk (the interleaved schedule accumulates into all)."""
    @contextmanager
    def no_sync():
        with ExitStack() as stack:
            for chunk in model:
                stack.enter_context(chunk.no_sync())
            yield
    return no_sync
