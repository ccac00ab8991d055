"""What the engine builds to update the weights: the basic optimizer, the ZeRO optimizer around
it and the learning-rate schedule (``deepspeed/runtime/engine.py``'s ``_configure_optimizer``,
``_configure_basic_optimizer``, ``_configure_zero_optimizer`` and ``_configure_lr_scheduler``).

Each function takes the engine, as DeepSpeed's methods take ``self``: it reads the engine's
config, module, data-parallel group and mpu, and returns what the engine then holds
(``basic_optimizer``, ``optimizer``, ``lr_scheduler``). The engine (engine.py) calls them once,
in that order, from its constructor.
"""

from __future__ import annotations

import torch

from minitron.ops.adam import FusedAdam
from minitron.ops.adam.cpu_adam import DeepSpeedCPUAdam
from minitron.ops.lamb import FusedLamb
from minitron.runtime import basic_optimizer, gradient_reduction, torch_schedules
from minitron.runtime.bf16_optimizer import BF16_Optimizer
from minitron.runtime.fp16.onebit import OnebitAdam
from minitron.runtime.loss_scaler import CreateLossScaler
from minitron.runtime.lr_schedules import SCHEDULERS
from minitron.runtime.zero.offload_config import offloaded
from minitron.runtime.zero.muon import muon_optimizer
from minitron.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3
from minitron.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer


def model_parallel_group(mpu):
    """The tensor-parallel group, or None when there is none to span. Megatron's
    parallel_state names it get_tensor_model_parallel_group; DeepSpeed's mpu interface
    get_model_parallel_group."""
    if mpu is None:
        return None
    if hasattr(mpu, "get_tensor_model_parallel_group"):
        size, group = mpu.get_tensor_model_parallel_world_size(), mpu.get_tensor_model_parallel_group
    else:
        size, group = mpu.get_model_parallel_world_size(), mpu.get_model_parallel_group
    return group() if size > 1 else None


def tensor_parallel_rank(mpu) -> int:
    """Which slice of a tensor-parallel weight this rank holds (DeepSpeed's
    bwc_tensor_model_parallel_rank): a pipeline grid's "model parallel" group spans the
    stages too, so its rank in that group is not the answer there."""
    if mpu is None:
        return 0
    for getter in ("get_slice_parallel_rank", "get_tensor_model_parallel_rank", "get_model_parallel_rank"):
        if hasattr(mpu, getter):
            return getattr(mpu, getter)()
    return 0


def configure_basic_optimizer(engine, optimizer, model_parameters) -> torch.optim.Optimizer:
    """The client's optimizer (an object, or a callable given the parameters), else the one the
    ds_config's ``"optimizer"`` section names."""
    config = engine._config
    params = list(model_parameters) if model_parameters is not None else list(engine.module.parameters())
    offload = offloaded(config.zero_config.offload_optimizer)
    if optimizer is not None and offload and config.zero_force_ds_cpu_optimizer \
            and not isinstance(optimizer, DeepSpeedCPUAdam):
        # DeepSpeed's ZeRORuntimeException: a GPU optimizer handed host tensors is slow at best
        raise ValueError("ZeRO-Offload with a client optimizer: DeepSpeed refuses it unless the ds_config says "
                         "\"zero_force_ds_cpu_optimizer\": false (or the config's own \"optimizer\" builds CPU-Adam)")
    if isinstance(optimizer, torch.optim.Optimizer):
        return optimizer
    if callable(optimizer):
        return optimizer(params)
    if config.optimizer_name is None:
        # DeepSpeed builds no optimizer then (a section without "type" included): ZeRO 1-2
        # refuse at initialize, stage 0 at the first step(). Either way a training run cannot go on.
        raise ValueError("no optimizer: the ds_config names no optimizer \"type\" and initialize() was given "
                         "no optimizer=; name one in either")
    kwargs = dict(config.optimizer_params)
    if config.optimizer_name == "SGD":     # any other torch.optim name: getattr(torch.optim, name)
        return torch.optim.SGD(params, **kwargs)
    if config.optimizer_name == "Muon":   # tags the module's matrices, then splits the groups (zero/muon/)
        return muon_optimizer.build(engine.module, params, kwargs)
    if config.optimizer_name not in ("Adam", "AdamW", "Lamb", "OneBitAdam"):   # Adagrad, Lion, torch's
        return basic_optimizer.build(config.optimizer_name, params, kwargs, offload)
    if config.optimizer_name == "Lamb":
        return FusedLamb(params, **kwargs)
    if config.optimizer_name == "OneBitAdam":   # it stops this engine's all-reduce at its freeze
        if engine.runs_pipelines:
            raise ValueError("OneBitAdam in minitron's PipelineEngine is not built (DeepSpeed's turns off the "
                             "pipeline's own all-reduce); use the data-parallel engine")
        return OnebitAdam(params, engine, **kwargs)
    # DeepSpeed's "Adam" is AdamW (decoupled weight decay) unless adam_w_mode is false.
    adam_w = kwargs.pop("adam_w_mode", True) or config.optimizer_name == "AdamW"
    # Its default is FusedAdam, whose state (and so checkpoint) differs from torch's Adam in
    # form, not in arithmetic: ops/adam/fused_adam.py. torch_adam asks for torch's instead.
    if kwargs.pop("torch_adam", False):
        return (torch.optim.AdamW if adam_w else torch.optim.Adam)(params, **kwargs)
    if offload:   # the states live on the host: DeepSpeed steps them with CPU-Adam (ops/adam/cpu_adam.py)
        return DeepSpeedCPUAdam(params, adamw_mode=adam_w, **kwargs)
    return FusedAdam(params, adam_w_mode=adam_w, **kwargs)


def configure_zero_optimizer(engine, basic, mp_group):
    """The ZeRO optimizer of the config's stage around ``basic``: stage 3's, else the one that
    runs stages 0, 1 and 2. ``mp_group`` (tensor parallel) joins the clipping norm and the
    overflow check."""
    config, zero, stage = engine._config, engine._config.zero_config, engine.zero_optimization_stage()
    dtype = torch.half if config.fp16_enabled else torch.bfloat16 if config.bfloat16_enabled else torch.float
    scaler = CreateLossScaler(dtype, config.loss_scale, config.loss_scale == 0, config.dynamic_loss_scale_args)
    if config.bfloat16_enabled and config.features.grad_accum_dtype == "fp32":   # stage 1 only (config.py)
        optimizer = BF16_Optimizer(basic, engine.data_parallel_group, scaler, config.gradient_clipping, mp_group,
                                   model_parallel_rank=tensor_parallel_rank(engine.mpu),
                                   immediate_grad_update=config.precision_options["immediate_grad_update"])
    elif stage == 3:
        optimizer = DeepSpeedZeroOptimizer_Stage3(engine.module, basic, engine.data_parallel_group, scaler,
                                                  config.gradient_clipping, mp_group, zero.overlap_comm,
                                                  offload_optimizer=zero.offload_optimizer,
                                                  offload_param=zero.offload_param, aio=config.aio_config,
                                                  zero_config=zero)
    else:
        optimizer = DeepSpeedZeroOptimizer(basic, engine.data_parallel_group, stage, scaler,
                                           config.gradient_clipping, mp_group, zero.reduce_bucket_size,
                                           model_parallel_rank=tensor_parallel_rank(engine.mpu),
                                           overlap_comm=zero.overlap_comm,
                                           round_robin_gradients=zero.round_robin_gradients,
                                           offload_optimizer=zero.offload_optimizer)
    # The gradients' dtype on the wire and where the mean's 1/dp goes (runtime/gradient_reduction.py)
    optimizer.gradient_reduction = gradient_reduction.for_stage(config, engine.dp_world_size)
    if config.bfloat16_enabled and stage in (1, 2) and not isinstance(optimizer, BF16_Optimizer):
        # bf16.check_grad_overflow: DeepSpeed hands it to stages 1 and 2 only (precision_config.py)
        optimizer.check_grad_overflow = config.precision_options["check_grad_overflow"]
    if stage in (1, 2) and not isinstance(optimizer, BF16_Optimizer):   # ZeRO 1-2's knobs (stage_1_and_2_config.py)
        optimizer.compute_grad_norm = zero.compute_grad_norm
        optimizer.use_multi_rank_bucket_allreduce = zero.use_multi_rank_bucket_allreduce
        optimizer.track_unused_parameters(not zero.ignore_unused_parameters)
        optimizer.elastic_checkpoint = zero.elastic_checkpoint
    if isinstance(basic, (FusedLamb, OnebitAdam)) and stage == 0:
        _tell_per_tensor_optimizer(basic, optimizer, config.fp16_enabled)
    return optimizer


def _tell_per_tensor_optimizer(basic, optimizer, fp16: bool) -> None:
    """DeepSpeed's stage 0 hands Lamb each tensor; minitron's one flat master per group holds
    them end to end, so Lamb is told where each lies to take its trust ratio per tensor.
    1-bit Adam compresses per tensor likewise; in fp16 DeepSpeed's FP16_Optimizer hands it one
    flat tensor per group, so the group is one part."""
    one = isinstance(basic, OnebitAdam) and fp16
    for master, params in zip(optimizer.single_partition_of_fp32_groups, optimizer.bit16_groups):
        sizes = [p.numel() for p in params]
        basic.tensor_sizes[master] = [sum(sizes)] if one else sizes
    if one:
        # FP16_Optimizer steps its optimizer once on zero gradients as it is built
        # (initialize_optimizer_states): in fp16, 1-bit Adam's first call happens here
        masters = optimizer.single_partition_of_fp32_groups
        for master in masters:
            master.grad = torch.zeros_like(master)
        basic.step()
        for master in masters:
            master.grad = None


def configure_lr_scheduler(engine, client_scheduler):
    """The client's schedule (an object, or a callable given the ZeRO optimizer), else the one
    the ds_config's ``"scheduler"`` section names, else None."""
    if client_scheduler is not None:
        return client_scheduler(engine.optimizer) if callable(client_scheduler) and not hasattr(
            client_scheduler, "step") else client_scheduler
    if engine._config.scheduler_name is None:
        return None
    if engine._config.scheduler_name not in SCHEDULERS:   # torch's: config.py allows it only where DeepSpeed's
        # engine.optimizer is the basic optimizer itself (fp32, no ZeRO); minitron's wrapper shares its groups
        return torch_schedules.build(engine._config.scheduler_name, engine.basic_optimizer,
                                     engine._config.scheduler_params)
    return SCHEDULERS[engine._config.scheduler_name](engine.optimizer, **engine._config.scheduler_params)
