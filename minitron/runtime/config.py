"""DeepSpeed's config: the ds_config JSON, read and resolved as ``deepspeed.runtime.config`` does.

The heart of it is the batch-size triad:

    train_batch_size = train_micro_batch_size_per_gpu × gradient_accumulation_steps × dp

where dp ("world size" in DeepSpeed's code) is the number of data-parallel ranks: the whole
world when no model-parallel unit (mpu) is passed, the data-parallel group's size when one is.
Any two of the three determine the third; given one, the missing ones follow with
gradient_accumulation_steps = 1; given all three, they must agree. DeepSpeed derives with
integer division and only then checks the product, so a train_batch_size that does not divide
is caught by the check, not by the derivation — the same happens here, with DeepSpeed's wording.

The other sections (fp16, bf16, gradient_clipping, optimizer, scheduler, zero_optimization,
steps_per_print) are parsed in ``config_sections.py``, each value as DeepSpeed reads it
(``config_values.py``). Every bad value is one ``DeepSpeedConfigError`` line naming the key;
keys minitron does not implement are refused rather than ignored, so a config never promises
what the run does not do.

The yardstick is DeepSpeed 0.19.8: a value it accepts for a key minitron models is accepted here
and resolves to the same value; anything else is refused. Its reader is hjson, not json, and
that decides more than one might think (``config_utils.py`` reads the file as hjson would).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Optional, Union

from minitron.runtime.comm.comms_logger_config import parse_comms_logger
from minitron.runtime.activation_checkpointing.config import parse_activation_checkpointing
from minitron.runtime import basic_optimizer, torch_schedules
from minitron.runtime.config_pipeline import parse_pipeline
from minitron.runtime.config_optimizer import OPTIMIZERS, ZERO_TESTED, parse_optimizer
from minitron.runtime.config_engine import ENGINE_KEYS, check_unmanaged, parse_engine_switches
from minitron.runtime.config_features import no_effect_notes, parse_features
from minitron.runtime.config_sections import SCHEDULERS, parse_precision, parse_scheduler, parse_zero
from minitron.runtime.config_utils import load_config   # others import it from here too (checkpointing, initialize)
from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, flag, json_value, number, positive_int
from minitron.runtime.precision_config import check_master_weights, parse_precision_options
from minitron.runtime.monitor.config import parse_monitor
from minitron.runtime.swap_tensor.aio_config import parse_aio
from minitron.runtime.torch_autocast import parse_torch_autocast
from minitron.runtime.zero.offload_config import offloaded
from minitron.runtime.profiling.config import parse_flops_profiler

TRIAD = ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps")
# Top-level keys minitron reads; anything else is refused, but for the keys check_keys accepts at
# DeepSpeed's default value only (check_keys' default_only; this file's DEFAULT_ONLY holds none).
TOP_LEVEL = TRIAD + ("steps_per_print", "gradient_clipping", "fp16", "bf16", "bfloat16", "optimizer",
                     "scheduler", "zero_optimization", "checkpoint", "zero_allow_untested_optimizer",
                     "communication_data_type", "prescale_gradients", "gradient_predivide_factor",
                     "wall_clock_breakdown", "tensorboard", "csv_monitor", "wandb", "comet", "flops_profiler",
                     "activation_checkpointing", "aio", "zero_force_ds_cpu_optimizer", "comms_logger",
                     "data_types", "timers", "compile", "torch_autocast", "pipeline") + ENGINE_KEYS
DEFAULT_ONLY: dict = {}
# Keys DeepSpeed 0.19.8 refuses whatever their value, because the feature behind them is gone
# (its _REMOVED_TOP_LEVEL_CONFIG_KEYS): a leftover would otherwise be silently ignored.
REMOVED = {"sparse_gradients": "DeepSpeed 0.19.8 removed sparse compression of dense embedding gradients and "
                               "refuses the key whatever its value (an nn.Embedding(sparse=True) needs no flag); "
                               "remove it"}


def resolve_batch_triad(train_batch: Optional[int], micro_batch: Optional[int],
                        grad_acc: Optional[int], world_size: int) -> tuple[int, int, int]:
    """DeepSpeed's _set_batch_related_parameters, then its _batch_assertion."""
    given = (train_batch is not None, micro_batch is not None, grad_acc is not None)
    if given == (True, True, True):
        pass
    elif given[:2] == (True, True):
        if micro_batch == 0:  # DeepSpeed divides by it here: a ZeroDivisionError
            _not_positive("train_micro_batch_size_per_gpu", 0, world_size)
        grad_acc = train_batch // micro_batch // world_size
    elif given[0] and given[2]:
        if grad_acc == 0:  # likewise
            _not_positive("gradient_accumulation_steps", 0, world_size)
        micro_batch = train_batch // world_size // grad_acc
    elif given[1:] == (True, True):
        train_batch = micro_batch * grad_acc * world_size
    elif given[0]:
        grad_acc, micro_batch = 1, train_batch // world_size
    elif given[1]:
        grad_acc, train_batch = 1, micro_batch * world_size
    else:
        raise DeepSpeedConfigError(
            "Either train_batch_size or train_micro_batch_size_per_gpu needs to be provided")
    for name, value in zip(TRIAD, (train_batch, micro_batch, grad_acc)):
        if value <= 0:
            _not_positive(name, value, world_size)
    if train_batch != micro_batch * grad_acc * world_size:
        raise DeepSpeedConfigError(
            "Check batch related parameters. train_batch_size is not equal to "
            "micro_batch_per_gpu * gradient_acc_step * world_size "
            f"{train_batch} != {micro_batch} * {grad_acc} * {world_size}")
    return train_batch, micro_batch, grad_acc


def _not_positive(name: str, value: int, world_size: int) -> None:
    label = {"train_batch_size": "Train batch size", "train_micro_batch_size_per_gpu": "Micro batch size per gpu",
             "gradient_accumulation_steps": "Gradient accumulation steps"}[name]  # DeepSpeed's wording
    raise DeepSpeedConfigError(f"{label}: {value} has to be greater than 0 ({name}, at data-parallel size "
                               f"{world_size})")


class DeepSpeedConfig:
    """The resolved ds_config, with DeepSpeed's attribute names.

    ``world_size`` is the data-parallel size: ``mpu.get_data_parallel_world_size()`` when a
    model-parallel unit is given (Megatron's parallel_state is one), else the number given, else
    the default process group's size, else 1 — the order DeepSpeed's constructor uses.
    """

    def __init__(self, config: Union[str, Path, dict], mpu: Any = None, world_size: Optional[int] = None):
        self._param_dict = load_config(config)
        self.world_size = self._data_parallel_size(mpu, world_size)
        params = self._param_dict
        for key, why in REMOVED.items():
            if key in params:
                raise DeepSpeedConfigError(f"{key}: {why}")
        check_keys(params, TOP_LEVEL, DEFAULT_ONLY, where="ds_config")
        triad = [positive_int(params, key, allow_none=True, minimum=None) for key in TRIAD]
        self.train_batch_size, self.train_micro_batch_size_per_gpu, self.gradient_accumulation_steps = \
            resolve_batch_triad(*triad, self.world_size)
        self.steps_per_print = positive_int(params, "steps_per_print", allow_none=True)  # None: DeepSpeed prints no periodic line
        # 1.0 since DeepSpeed 0.19.3 (0 before). DeepSpeed clips when the value is > 0, so 0 or
        # a negative value turns clipping off there and here alike.
        self.gradient_clipping = number(params, "gradient_clipping", 1.0, "")
        precision = parse_precision(params)
        # check_grad_overflow, auto_cast, ... (precision_config.py says where each acts)
        self.precision_options = parse_precision_options(params)
        self.fp16_enabled, self.bfloat16_enabled = precision.fp16, precision.bf16
        self.loss_scale, self.initial_dynamic_scale = precision.loss_scale, precision.initial_scale
        self.dynamic_loss_scale_args = precision.dynamic_args
        self.optimizer_name, self.optimizer_params = parse_optimizer(params)
        self.scheduler_name, self.scheduler_params = parse_scheduler(params)
        self.zero_config = parse_zero(params)
        self.zero_optimization_stage = self.zero_config.stage
        self.zero_enabled = self.zero_optimization_stage > 0
        # the engine's switches: gradient_allreduce_op, managed_gradient_accumulation, ... (config_engine.py)
        self.engine_switches = parse_engine_switches(params, self.zero_optimization_stage)
        check_unmanaged(self.engine_switches, self.zero_config)
        self.zero_allow_untested_optimizer = flag(params, "zero_allow_untested_optimizer", False, "ds_config")
        if self.optimizer_name == "OneBitAdam":   # its compressed stage all-reduces the momentum, not gradients
            if self.zero_enabled:   # DeepSpeed's assertion, before its untested-optimizer check
                raise DeepSpeedConfigError(f"optimizer.type OneBitAdam is not compatible with ZeRO (stage "
                                           f"{self.zero_optimization_stage}); use zero_optimization.stage 0")
            if self.bfloat16_enabled:   # DeepSpeed steps it inside its BF16_Optimizer, which minitron lacks
                raise DeepSpeedConfigError("optimizer.type OneBitAdam with bf16 is not built in minitron (it runs "
                                           "in fp32 and fp16); set bf16.enabled false")
        if self.optimizer_name == "Muon":   # built at stage 0 in fp32 (basic_optimizer.muon_refusal)
            refusal = basic_optimizer.muon_refusal(self.zero_optimization_stage, "fp16" if self.fp16_enabled
                                                   else "bf16" if self.bfloat16_enabled else "fp32")
            if refusal:
                raise DeepSpeedConfigError(refusal)
        if self.zero_enabled and self.optimizer_name not in (None,) + ZERO_TESTED \
                and not self.zero_allow_untested_optimizer:   # DeepSpeed's _do_optimizer_sanity_check
            raise DeepSpeedConfigError(f"optimizer.type {self.optimizer_name!r} is untested with ZeRO (stage "
                                       f"{self.zero_optimization_stage}); DeepSpeed runs it only with "
                                       f"\"zero_allow_untested_optimizer\": true")
        if self.optimizer_name not in (None,) + tuple(OPTIMIZERS):   # torch's, Adagrad, Lion...: tried once
            basic_optimizer.check(self.optimizer_name, self.optimizer_params,
                                  offloaded(getattr(self.zero_config, "offload_optimizer", None)))
        if self.scheduler_name is not None and self.scheduler_name not in SCHEDULERS:   # torch's, by name
            torch_schedules.check_wrapped(self.scheduler_name, self.zero_optimization_stage, self.fp16_enabled,
                                          self.bfloat16_enabled)
        self._gradient_communication(params)
        check_master_weights(self.precision_options, self.zero_optimization_stage,
                             getattr(self.zero_config, "offload_optimizer", None))
        # ZeRO-Offload's companions: the aio section (NVMe swap files, swap_tensor/aio_config.py), and
        # whether a client optimizer may step offloaded states (DeepSpeed refuses one unless false)
        self.aio_config = parse_aio(params)
        self.zero_force_ds_cpu_optimizer = flag(params, "zero_force_ds_cpu_optimizer", True, "ds_config")
        self.monitor_config = parse_monitor(params)   # where the engine writes its scalars (runtime/monitor/)
        # the comms logger, on whenever the section is there, as in DeepSpeed (runtime/comm/comms_logger_config.py)
        self.comms_config = parse_comms_logger(params)
        self.pipeline = parse_pipeline(params)   # read by the PipelineEngine (runtime/config_pipeline.py)
        # a per-module profile of one step (runtime/profiling/); it turns the engine's timers on, as in DeepSpeed
        self.flops_profiler_config = parse_flops_profiler(params)
        # ZeRO-R's section: read by deepspeed.checkpointing.configure, not by the engine
        # (runtime/activation_checkpointing/)
        self.activation_checkpointing_config = parse_activation_checkpointing(params)
        self.wall_clock_breakdown = flag(params, "wall_clock_breakdown", False, "ds_config") \
            or self.flops_profiler_config["enabled"]
        # "checkpoint": {"load_universal": true}: load_checkpoint reads a universal checkpoint
        # (runtime/checkpoint/universal_checkpoint.py); its other keys, data_types, timers and
        # compile: config_features.py
        checkpoint = params.get("checkpoint", {})
        if not isinstance(checkpoint, dict):
            raise DeepSpeedConfigError(f"checkpoint must be an object, got {json_value(checkpoint)}")
        check_keys(checkpoint, ("load_universal", "tag_validation", "use_node_local_storage", "parallel_write"), {},
                   "checkpoint")
        self.load_universal_checkpoint = flag(checkpoint, "load_universal", False, "checkpoint")
        model_dtype = "fp16" if self.fp16_enabled else "bf16" if self.bfloat16_enabled else "fp32"
        self.features = parse_features(params, checkpoint, model_dtype, self.zero_config)
        # the forward under torch.autocast, and ZeRO's per-dtype gradient buckets (runtime/torch_autocast.py)
        self.torch_autocast = parse_torch_autocast(params, self.zero_config.stage3.zero_quantized_weights)

    def _gradient_communication(self, params: dict) -> None:
        """communication_data_type, prescale_gradients, gradient_predivide_factor (what they do:
        runtime/gradient_reduction.py), with the combinations DeepSpeed's ZeRO refuses."""
        kind = params.get("communication_data_type")
        if kind is not None and (not isinstance(kind, str) or kind.lower() not in ("fp32", "fp16", "bf16")):
            raise DeepSpeedConfigError(f"communication_data_type must be \"fp32\", \"fp16\" or \"bf16\", got "
                                       f"{json_value(kind)}")
        self.communication_data_type = kind.lower() if kind is not None else None   # None: the gradients' dtype
        self.prescale_gradients = flag(params, "prescale_gradients", False, "ds_config")
        self.gradient_predivide_factor = number(params, "gradient_predivide_factor", 1.0, "")
        if self.gradient_predivide_factor <= 0:   # DeepSpeed divides by it
            raise DeepSpeedConfigError(f"gradient_predivide_factor must be positive, got "
                                       f"{json_value(params['gradient_predivide_factor'])}")
        zero, stage = self.zero_config, self.zero_optimization_stage
        scaled = self.prescale_gradients or self.gradient_predivide_factor != 1
        if self.engine_switches.gradient_allreduce_op == "sum":   # a sum reads neither knob: DeepSpeed checks neither
            scaled = False
        if stage >= 2 and zero.reduce_scatter and scaled:
            what = "prescale_gradients" if self.prescale_gradients else "gradient_predivide_factor != 1.0"
            raise DeepSpeedConfigError(f"{what} is not supported by DeepSpeed's ZeRO stage {stage} with reduce "
                                       f"scatter enabled; set zero_optimization.reduce_scatter to false or drop it")
        if stage == 3 and self.gradient_predivide_factor != 1:
            raise DeepSpeedConfigError("gradient_predivide_factor != 1.0 at ZeRO stage 3 is not modelled in minitron "
                                       "(DeepSpeed divides by it and multiplies back only when it is not dp); drop it")

    @staticmethod
    def _data_parallel_size(mpu: Any, world_size: Optional[int]) -> int:
        if mpu is not None:
            return mpu.get_data_parallel_world_size()
        if world_size is not None:
            if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
                raise DeepSpeedConfigError(f"the data-parallel size must be at least 1, got {world_size!r}")
            return world_size
        dist = sys.modules.get("torch.distributed")  # only a program that already uses torch asks it
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist.get_world_size()
        return 1

    def as_dict(self) -> dict:
        """Every resolved value, for ``minitron ds-config --json`` and the chapter's tables."""
        return {
            "data_parallel_size": self.world_size,
            "train_batch_size": self.train_batch_size,
            "train_micro_batch_size_per_gpu": self.train_micro_batch_size_per_gpu,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "steps_per_print": self.steps_per_print,
            "gradient_clipping": self.gradient_clipping,
            "fp16_enabled": self.fp16_enabled,
            "bfloat16_enabled": self.bfloat16_enabled,
            "loss_scale": self.loss_scale,
            "initial_dynamic_scale": self.initial_dynamic_scale,
            "dynamic_loss_scale_args": self.dynamic_loss_scale_args,
            "optimizer": {"type": self.optimizer_name, "params": self.optimizer_params},
            "scheduler": {"type": self.scheduler_name, "params": self.scheduler_params},
            "zero_optimization": self.zero_config.as_dict(),
            "communication_data_type": self.communication_data_type,
            "prescale_gradients": self.prescale_gradients,
            "gradient_predivide_factor": self.gradient_predivide_factor,
            "wall_clock_breakdown": self.wall_clock_breakdown,
            "flops_profiler": self.flops_profiler_config,
            "torch_autocast": self.torch_autocast.as_dict(),
            **vars(self.engine_switches),
            "no_effect": no_effect_notes(self._param_dict),   # given, and changing nothing here: why
            **{name: getattr(self.monitor_config, name) for name in ("tensorboard", "csv_monitor", "wandb")},
        }
