"""The ``DeepSpeedEngine`` that ``initialize()`` (runtime/__init__.py) returns
(``deepspeed/runtime/engine.py``), small.

The engine wraps the model and takes over the three calls of a training loop:

    loss = engine(batch)      the module's forward (at ZeRO-3, with parameters gathered per module)
    engine.backward(loss)     loss / gradient_accumulation_steps, times the fp16 loss scale, then
                              backward and the stage's gradient reduction
    engine.step()             counts a micro-step; only at an accumulation boundary (every
                              gradient_accumulation_steps-th call) does it step the optimizer and
                              the learning-rate schedule

so a loop calls all three once per micro-batch and never asks whether this one is the last of
its step. The ZeRO optimizer (``zero/``) does the partitioning; the engine only picks it
(engine_optimizer.py builds it, with the basic optimizer inside and the schedule). Saving and
loading are checkpoint/engine_checkpoint.py's; the monitors and timers monitor/events.py's.
"""

from __future__ import annotations

import torch

from minitron import comm as dist   # deepspeed/runtime/engine.py: from deepspeed import comm as dist
from minitron.accelerator import get_accelerator
from minitron.runtime.checkpoint import engine_checkpoint as checkpoint
from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime import engine_switches as switches
from minitron.runtime.engine_optimizer import (configure_basic_optimizer, configure_lr_scheduler,
                                               configure_zero_optimizer, model_parallel_group)
from minitron.runtime.monitor.events import configure_monitoring, report_step
from minitron.runtime.torch_autocast import autocast_if_enabled, init_autocast_params, warn_nested_autocast
from minitron.trace import traced


def _cast_inputs_half(inputs):
    """fp16.auto_cast: every floating tensor among the positional inputs (inside lists, tuples and
    dicts too) as fp16; the rest (token ids, masks, plain values) as given. Keyword inputs are
    left alone, as DeepSpeed leaves them."""
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(_cast_inputs_half(v) for v in inputs)
    if isinstance(inputs, dict):
        return {k: _cast_inputs_half(v) for k, v in inputs.items()}
    return inputs.half() if torch.is_tensor(inputs) and inputs.is_floating_point() else inputs


class DeepSpeedEngine(torch.nn.Module):
    runs_pipelines = False   # PipelineEngine (runtime/pipe/engine.py) says True

    def __init__(self, model, optimizer, model_parameters, training_data, lr_scheduler, mpu, collate_fn,
                 config: DeepSpeedConfig):
        super().__init__()
        self.module, self.mpu, self._config = model, mpu, config
        switches.configure_switches(self)   # log_level, disable_python_gc, ... (engine_switches.py)
        self.data_parallel_group = mpu.get_data_parallel_group() if mpu is not None else dist.get_world_group()
        self.dp_world_size = dist.get_world_size(group=self.data_parallel_group)
        self.global_rank = dist.get_rank()
        dist.configure(config.comms_config)   # the comms logger, before the model's broadcast, as DeepSpeed
        pp = mpu.get_pipeline_model_parallel_world_size() if hasattr(
            mpu, "get_pipeline_model_parallel_world_size") else 1
        if pp > 1 and not self.runs_pipelines:   # DeepSpeed runs pipelines in its PipelineEngine
            raise ValueError(f"the mpu has pipeline-parallel size {pp}, and this engine runs data and tensor "
                             "parallelism only: build the model as a PipelineModule (runtime/pipe)")
        # The clipping norm and the overflow check also span the tensor-parallel group.
        mp_group = model_parallel_group(mpu)
        self.global_steps = self.global_samples = self.micro_steps = self.skipped_steps = 0
        self._is_gradient_accumulation_boundary, self._step_applied = None, False
        self.enable_backward_allreduce = True   # 1-bit Adam turns it off when its variance freezes
        switches.memory(self, "DeepSpeed Engine: Before configure distributed model")
        self._configure_distributed_model()
        self._broadcast_model()
        # torch_autocast: the safe modules' parameters marked before ZeRO is built (torch_autocast.py)
        if config.torch_autocast.enabled:
            init_autocast_params(self.module, config.torch_autocast)
        # The optimizer and the schedule, as DeepSpeed's _configure_optimizer builds them (engine_optimizer.py)
        self.basic_optimizer = configure_basic_optimizer(self, optimizer, model_parameters)
        self.optimizer = configure_zero_optimizer(self, self.basic_optimizer, mp_group)
        self.lr_scheduler = configure_lr_scheduler(self, lr_scheduler)
        self.training_dataloader = None
        # Scalars to TensorBoard/CSV/wandb, wall_clock_breakdown's timers, the flops profiler
        configure_monitoring(self, config, mp_group)
        if training_data is not None:   # with dataloader_drop_last (engine_switches.py)
            self.training_dataloader = switches.training_dataloader(self, training_data, collate_fn)
        switches.dump_state(self)   # last: every attribute the engine ended up with

    # --- set-up ------------------------------------------------------------------------------

    def _configure_distributed_model(self) -> None:
        """The module in the config's precision, on this rank's device (cuda:N on an nccl rank,
        the CPU on a gloo one), before anything is made from its parameters: ZeRO's flat buffers
        are cut from them, and a collective (nccl) moves only device tensors."""
        if self._config.fp16_enabled:
            self.module.half()
        elif self._config.bfloat16_enabled:
            self.module.to(torch.bfloat16)
        switches.keep_fp32_buffers(self)   # data_types.keep_in_fp32_modules
        self.device = torch.device(get_accelerator().current_device_name())
        self.module.to(self.device)

    def _broadcast_model(self) -> None:
        """Every data-parallel replica starts from the first one's weights and buffers."""
        src = dist.get_global_rank(self.data_parallel_group, 0)
        for tensor in list(self.module.parameters()) + list(self.module.buffers()):
            dist.broadcast(tensor.data, src, group=self.data_parallel_group)

    # --- the config, by DeepSpeed's accessor names ----------------------------------------------

    def train_batch_size(self) -> int:
        return self._config.train_batch_size

    def train_micro_batch_size_per_gpu(self) -> int:
        return self._config.train_micro_batch_size_per_gpu

    def gradient_accumulation_steps(self) -> int:
        return self._config.gradient_accumulation_steps

    def zero_optimization_stage(self) -> int:
        return self._config.zero_optimization_stage

    def get_lr(self) -> list:
        return [group["lr"] for group in self.optimizer.param_groups]

    # --- the loop: forward, backward, step ----------------------------------------------------

    def forward(self, *inputs, **kwargs):
        switches.memory(self, "Engine before forward")   # memory_breakdown, here and below
        profiling = self.flops_profiler_active()
        if profiling:
            self.flops_profiler.start_profile()
        self._start_timers(self.engine_timers.forward_timers)
        if self._config.precision_options["auto_cast"]:   # fp16.auto_cast, fp16 enabled or not (as DeepSpeed)
            inputs = _cast_inputs_half(inputs)
        with self.autocast():   # torch_autocast's section, when enabled
            output = self.module(*inputs, **kwargs)
        self._stop_timers(self.engine_timers.forward_timers)
        if profiling:
            self.flops_profiler.stop_profile()
        switches.memory(self, "Engine after forward")
        return output

    def autocast(self):
        """The forward's torch.autocast context, as the torch_autocast section asks (DeepSpeed's
        autocast_if_enabled): a caller's own autocast gives way to it, with one warning."""
        return autocast_if_enabled(self._config.torch_autocast, self.device.type, warn_nested_autocast)

    def flops_profiler_active(self) -> bool:
        """DeepSpeed profiles on global rank 0 while global_steps is the config's profile_step."""
        return self.flops_profiler is not None and self.global_rank == 0 and \
            self.global_steps == self._config.flops_profiler_config["profile_step"]

    def _start_timers(self, names: list) -> None:   # no names unless wall_clock_breakdown
        for name in names:
            self.timers(name).start()

    def _stop_timers(self, names: list) -> None:
        for name in names:
            self.timers(name).stop()

    def is_gradient_accumulation_boundary(self) -> bool:
        """True for the micro-batch whose step() updates the weights: the last of each
        gradient_accumulation_steps, unless the caller said otherwise (below)."""
        if self._is_gradient_accumulation_boundary is not None:
            return self._is_gradient_accumulation_boundary
        if not switches.managed(self):   # managed_gradient_accumulation false: step() is the boundary
            return self._running_engine_step
        return (self.micro_steps + 1) % self.gradient_accumulation_steps() == 0

    def set_gradient_accumulation_boundary(self, is_boundary) -> None:
        """Take over the counting: a loop that runs its own micro-batches (Megatron-DeepSpeed's
        schedules) says False before each but the last, True before the last, and calls step()
        once per global batch. None goes back to counting micro-steps."""
        self._is_gradient_accumulation_boundary = is_boundary

    # --8<-- [start:backward-step]
    @traced(args=lambda self, loss: {"boundary": self.is_gradient_accumulation_boundary()})
    def backward(self, loss: torch.Tensor) -> torch.Tensor:
        switches.memory(self, "Engine before backward")
        self._unmanaged_backward_count += 1   # global_samples' count when the caller owns the boundary
        # Each micro-batch's loss is a mean over its samples; dividing by the number of
        # micro-batches makes the accumulated gradient the mean over the whole step's batch.
        if self.gradient_accumulation_steps() > 1:
            loss = loss.float() / self.gradient_accumulation_steps()
        # ZeRO's gradient hooks must know, during backward, whether this micro-batch ends the step.
        self.optimizer.is_gradient_accumulation_boundary = self.is_gradient_accumulation_boundary()
        self._start_timers(self.engine_timers.backward_timers + self.engine_timers.backward_inner_timers)
        self.optimizer.backward(loss)    # times the loss scale (1 unless fp16), then backward
        self._stop_timers(self.engine_timers.backward_inner_timers)
        self._start_timers(self.engine_timers.backward_reduce_timers)
        if self.enable_backward_allreduce:
            self.optimizer.reduce_gradients(self.is_gradient_accumulation_boundary())
        else:   # 1-bit Adam after its warm-up: each rank keeps its own gradient; the optimizer averages momenta
            self.optimizer.reduce_gradients(self.is_gradient_accumulation_boundary(), all_reduce=False)
        self._stop_timers(self.engine_timers.backward_reduce_timers + self.engine_timers.backward_timers)
        switches.memory(self, "Engine after backward")
        return loss

    def step(self, lr_kwargs: dict | None = None) -> None:
        """``lr_kwargs`` go to the schedule's step(): Megatron's OptimizerParamScheduler counts
        samples and is told how many (``{"increment": global batch}``)."""
        self._step_applied = False
        switches.memory(self, "Engine before step")
        profiling = self.flops_profiler_active()   # asked before the step counts itself
        self._start_timers(self.engine_timers.step_timers)
        if not switches.managed(self):
            switches.unmanaged_boundary(self)   # reduces what backward left local; the boundary until the end
        boundary = self.is_gradient_accumulation_boundary()
        if boundary:
            self._take_model_step(lr_kwargs)
        self._stop_timers(self.engine_timers.step_timers)
        report_step(self, boundary, profiling)   # monitors, the flops profile, the timers' lines
        self.micro_steps += 1
        self._running_engine_step = False
        switches.memory(self, "Engine after step")

    def _take_model_step(self, lr_kwargs: dict | None = None) -> None:
        self.optimizer.step()             # skips itself on an fp16 overflow
        self._step_applied = not self.optimizer.overflow
        if self.optimizer.overflow:
            self.skipped_steps += 1       # ...and then the schedule does not advance either
        elif self.lr_scheduler is not None:
            self.lr_scheduler.step(**(lr_kwargs or {}))
        self.global_steps += 1
        self.global_samples += switches.samples_this_step(self)
    # --8<-- [end:backward-step]

    def destroy(self) -> None:
        """What the engine holds of the process, given back (disable_python_gc's switch)."""
        switches.destroy(self)

    def collect_python_gc(self) -> int:
        """One collection at a point the loop chooses (with disable_python_gc, the only ones)."""
        return switches.python_gc.collect()

    def was_step_applied(self) -> bool:
        """Did the last step() update the weights? False between boundaries and on an overflow."""
        return self._step_applied

    def get_global_grad_norm(self):
        """The gradient norm of the last applied step, before clipping (None before the first).
        ZeRO keeps it on the device; reading it here is the caller's wait, once, when it logs."""
        norm = self.optimizer._global_grad_norm
        return None if norm is None else float(norm)

    def bytes_held(self) -> dict:
        """Parameter, gradient and optimizer-state bytes held by this rank (see zero/)."""
        return self.optimizer.bytes_held()

    def host_bytes_held(self) -> dict:
        """What ZeRO-Offload keeps in host memory instead (all zero without offloading)."""
        return self.optimizer.host_bytes_held()

    # --- checkpoints: DeepSpeed 0.19.8's layout (runtime/checkpoint/) ---------------------------

    def save_checkpoint(self, save_dir, tag=None, client_state: dict | None = None, save_latest: bool = True):
        """``save_dir/tag/`` in DeepSpeed's layout, then ``save_dir/latest`` naming the tag. Every
        rank must call it: each writes its own partition."""
        if getattr(self.optimizer, "swapper", None) is not None:   # ZeRO-Infinity's states are in files
            raise ValueError("save_checkpoint with offload_optimizer.device \"nvme\" is not built in minitron (the "
                             "states live in swap files); use device \"cpu\" to save")
        return checkpoint.save_checkpoint(self, save_dir, tag, client_state, save_latest)

    def load_checkpoint(self, load_dir, tag=None, load_module_strict: bool = True):
        """Returns ``(load_path, client_state)``; ``(None, None)`` when there is nothing to load.
        Reads minitron's checkpoints and DeepSpeed's alike (without importing DeepSpeed), and,
        with ``"checkpoint": {"load_universal": true}``, universal ones at any dp size and stage."""
        return checkpoint.load_checkpoint(self, load_dir, tag, load_module_strict)
