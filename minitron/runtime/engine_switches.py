"""What the ds_config's engine switches (config_engine.py) do to a running engine, where
DeepSpeed 0.19.8's ``DeepSpeedEngine`` does it:

    log_level                 __init__, first: the engine logger's level (runtime/utils.py)
    disable_python_gc         __init__: one collection, then automatic collection off until
                              destroy() (runtime/python_gc.py)
    memory_breakdown          rank 0 prints memory before and after forward, backward and step
    dump_state                end of __init__, rank 0: every attribute of the engine, logged
    data_types.keep_in_fp32_modules
                              the named buffers back to fp32 after the model's cast (keep_in_fp32.py)
    dataloader_drop_last      the training dataloader: a last batch smaller than the micro-batch
                              is dropped instead of being served
    managed_gradient_accumulation false
                              backward() only accumulates; each step() is the boundary: stages
                              0-1 reduce there (2-3 reduced in backward already), the optimizer
                              steps, and global_samples counts the micro-batches actually run
"""

from __future__ import annotations

import torch

from minitron import comm as dist
from minitron.runtime import python_gc
from minitron.runtime.config_engine import LOG_LEVELS, vocabulary_warning
from minitron.runtime.keep_in_fp32 import keep_buffers_in_fp32, keep_in_fp32_pattern
from minitron.runtime.utils import logger, print_configuration, see_memory_usage, set_log_level


def configure_switches(engine) -> None:
    """The switches that act once, as the engine is built (before anything else it does)."""
    switches = engine._config.engine_switches
    if switches.log_level is not None:
        set_log_level(LOG_LEVELS[switches.log_level])
    warning = vocabulary_warning(switches)
    if warning:   # DeepSpeed warns from its config's sanity check, on every rank
        logger.warning(warning)
    if not switches.managed_gradient_accumulation and engine.runs_pipelines:
        raise ValueError("managed_gradient_accumulation false is not supported with pipeline parallelism "
                         "(DeepSpeed asserts it): the pipeline schedule owns the boundary")
    engine._unmanaged_backward_count = 0
    engine._running_engine_step = False
    engine._python_gc_held = switches.disable_python_gc
    if engine._python_gc_held:
        python_gc.acquire()


def keep_fp32_buffers(engine) -> None:
    """After the cast to fp16/bf16: the buffers data_types.keep_in_fp32_modules names, back to fp32."""
    config = engine._config
    dtype = "fp16" if config.fp16_enabled else "bf16" if config.bfloat16_enabled else "fp32"
    pattern = keep_in_fp32_pattern(engine.module, config.features.keep_in_fp32_modules, dtype)
    if pattern is not None:
        keep_buffers_in_fp32(engine.module, pattern)


def memory(engine, message: str) -> None:
    see_memory_usage(message, force=engine._config.engine_switches.memory_breakdown)


def dump_state(engine) -> None:
    if engine._config.engine_switches.dump_state and engine.global_rank == 0:
        print_configuration(engine, "DeepSpeedEngine")


def training_dataloader(engine, training_data, collate_fn):
    """DeepSpeed's deepspeed_io, without its curriculum sampler: each data-parallel rank reads
    its own share of the dataset, a micro-batch at a time."""
    sampler = torch.utils.data.DistributedSampler(training_data, num_replicas=engine.dp_world_size,
                                                  rank=dist.get_rank(group=engine.data_parallel_group))
    return torch.utils.data.DataLoader(training_data, batch_size=engine.train_micro_batch_size_per_gpu(),
                                       sampler=sampler, collate_fn=collate_fn,
                                       drop_last=engine._config.engine_switches.dataloader_drop_last)


def managed(engine) -> bool:
    return engine._config.engine_switches.managed_gradient_accumulation


def unmanaged_boundary(engine) -> None:
    """step() under managed_gradient_accumulation false: the gradients accumulated since the last
    step() are reduced now where backward left them local (stages 0 and 1)."""
    engine._running_engine_step = True
    if engine.zero_optimization_stage() < 2:
        engine.optimizer.is_gradient_accumulation_boundary = True
        # 1-bit Adam past its freeze keeps each rank's gradient: its optimizer averages the momenta
        engine.optimizer.reduce_gradients(True, all_reduce=engine.enable_backward_allreduce)


def samples_this_step(engine) -> int:
    """global_samples' increment: the whole batch, or (unmanaged) the micro-batches run since the
    last step() times what each holds over the data-parallel group."""
    count, engine._unmanaged_backward_count = engine._unmanaged_backward_count, 0
    if managed(engine):
        return engine.train_batch_size()
    return engine.train_batch_size() // engine.gradient_accumulation_steps() * count


def destroy(engine) -> None:
    """Give back what the engine took from the process: automatic Python GC, if it turned it off."""
    if getattr(engine, "_python_gc_held", False):
        engine._python_gc_held = False
        python_gc.release()
