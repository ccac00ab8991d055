"""The ds_config's top-level switches of DeepSpeed 0.19.8's engine (``runtime/config.py``'s
``get_*`` readers): each read raw (``get_scalar_param``), as DeepSpeed reads it, and what it does.

    gradient_allreduce_op ("mean")   "sum": the data-parallel reduction adds the ranks' gradients
                                     and never divides by dp (runtime/gradient_reduction.py);
                                     DeepSpeed refuses it at ZeRO stage 3
    managed_gradient_accumulation (true)
                                     false: the caller owns the boundary, every step() reduces
                                     (stages 0-1) and updates (engine.py)
    dataloader_drop_last (false)     the training dataloader drops the last short batch
    disable_python_gc (false)        the engine collects once, then turns Python's cyclic GC
                                     off while it lives (runtime/python_gc.py)
    dump_state (false)               rank 0 logs every attribute of the engine once it is built
    memory_breakdown (false)         host and device memory lines around forward, backward, step
    log_level (null)                 the level of the engine's logger (runtime/utils.py)
    vocabulary_size (null)           a warning when it is not a multiple of 8 (tensor cores)

Three more are accepted and change nothing here; ``NO_EFFECT`` says why, and ``minitron ds-config``
prints it.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Optional

from minitron.runtime.config_values import DeepSpeedConfigError, flag, json_value, positive_int

# What DeepSpeed does with the key, and why it changes nothing in minitron's engine.
NO_EFFECT = {
    "disable_allgather": "DeepSpeed 0.19.8 reads it into its config and nothing reads it after that",
    "seq_parallel_communication_data_type": "DeepSpeed-Ulysses' gradient dtype, read only when the mpu has a "
                                            "sequence-parallel size > 1; minitron's engine takes no Ulysses mpu",
    "use_data_before_expert_parallelism": "orders the ranks of deepspeed.moe's expert and expert-data groups; "
                                          "minitron's engine builds no deepspeed.moe layers (Megatron's MoE "
                                          "has its own groups)",
}
LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING, "error": logging.ERROR,
              "critical": logging.CRITICAL}
ALLREDUCE_OPS = ("mean", "sum")
TENSOR_CORE_ALIGN_SIZE = 8   # DeepSpeed's constant: the vocabulary warning's multiple
ENGINE_KEYS = ("gradient_allreduce_op", "managed_gradient_accumulation", "dataloader_drop_last",
               "disable_python_gc", "dump_state", "memory_breakdown", "log_level", "vocabulary_size") + tuple(NO_EFFECT)


@dataclass
class EngineSwitches:
    gradient_allreduce_op: str = "mean"
    managed_gradient_accumulation: bool = True
    dataloader_drop_last: bool = False
    disable_python_gc: bool = False
    dump_state: bool = False
    memory_breakdown: bool = False
    log_level: Optional[str] = None
    vocabulary_size: Optional[int] = None
    disable_allgather: bool = False
    seq_parallel_communication_data_type: str = "fp32"
    use_data_before_expert_parallelism: bool = False


def _lowered(params: dict, key: str, default, allowed) -> Optional[str]:
    """A string DeepSpeed lower-cases before it looks it up ("SUM" is "sum")."""
    value = params.get(key, default)
    if value is None and default is None:
        return None
    if not isinstance(value, str) or value.lower() not in allowed:
        raise DeepSpeedConfigError(f"{key} must be one of {', '.join(map(repr, allowed))}, got {json_value(value)}")
    return value.lower()


def parse_engine_switches(params: dict, zero_stage: int) -> EngineSwitches:
    op = _lowered(params, "gradient_allreduce_op", "mean", ALLREDUCE_OPS)
    if op == "sum" and zero_stage == 3:   # DeepSpeed's _do_error_check
        raise DeepSpeedConfigError("gradient_allreduce_op 'sum' is not supported with ZeRO stage 3 (DeepSpeed "
                                   "refuses it); use 'mean' or stage 0-2")
    switches = EngineSwitches(
        gradient_allreduce_op=op,
        log_level=_lowered(params, "log_level", None, tuple(LOG_LEVELS)),
        vocabulary_size=positive_int(params, "vocabulary_size", allow_none=True),
        seq_parallel_communication_data_type=_lowered(params, "seq_parallel_communication_data_type", "fp32",
                                                      ("fp32", "fp16", "bf16")),
        **{key: flag(params, key, default, "ds_config") for key, default in (
            ("managed_gradient_accumulation", True), ("dataloader_drop_last", False), ("disable_python_gc", False),
            ("dump_state", False), ("memory_breakdown", False), ("disable_allgather", False),
            ("use_data_before_expert_parallelism", False))})
    return switches


def check_unmanaged(switches: EngineSwitches, zero_config) -> None:
    """DeepSpeed's step() asserts: with the caller owning the boundary, ZeRO's in-backward
    reduction (overlap_comm) runs only where gradients are partitioned anyway (stage 2; stage 3
    reduces in backward too)."""
    if not switches.managed_gradient_accumulation and zero_config.overlap_comm and zero_config.stage < 2:
        raise DeepSpeedConfigError("managed_gradient_accumulation false supports zero_optimization.overlap_comm only "
                                   "with ZeRO stage 2 (DeepSpeed asserts it); set overlap_comm false or use stage 2 or 3")


def vocabulary_warning(switches: EngineSwitches) -> Optional[str]:
    """DeepSpeed's config warning, word for word in substance: a vocabulary that is not a multiple
    of 8 leaves the output layer's matmul off the tensor cores' tile size."""
    size = switches.vocabulary_size
    if size and size % TENSOR_CORE_ALIGN_SIZE:
        return (f"DeepSpeedConfig: vocabulary size {size} is not aligned to {TENSOR_CORE_ALIGN_SIZE}, "
                "may hurt tensor core utilization")
    return None
