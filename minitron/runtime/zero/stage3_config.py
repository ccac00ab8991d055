"""zero_optimization's stage-3 and ZeRO++ keys, as DeepSpeed 0.19.8's DeepSpeedZeroConfig
defines them (zero/config.py): each field under its own name and, for the ``stage3_`` ones,
under that alias too (DeepSpeed's models take both). Read by zero/stage3.py only; at stages 0-2
they are accepted and change nothing, as in DeepSpeed.

Accepted at any value, with what reads them (three with other defaults than DeepSpeed's:
DEEPSPEED_DEFAULTS below says which and why):
    stage3_prefetch_bucket_size, stage3_max_live_parameters, stage3_max_reuse_distance,
    stage3_param_persistence_threshold, stage3_model_persistence_threshold
                          partitioned_param_coordinator.py
    zero_hpz_partition_size, zero_quantized_weights        zeropp.py
    leaf_module, stage3_module_granularity_threshold
                          modules gathered whole, with their descendants: leaf_modules.py
    sub_group_size        each param group's parameters cut into sub-groups of about that many
                          of my elements, each its own fp32 master, stepped (and under NVMe
                          swapped) one after another: stage3.py
    zero_quantized_gradients                               runtime/comm/coalesced_collectives.py
    stage3_gather_16bit_weights_on_model_save (and its old name, ..._fp16_...)
                          read only by DeepSpeed's engine.save_16bit_model(), which gathers a
                          16-bit state dict onto rank 0; minitron's engine has no such method,
                          so the key changes nothing here, as in a DeepSpeed run that never calls it
    stage3_use_all_reduce_for_fetch_params
                          a gather of several parameters becomes one all-reduce of a zeroed
                          buffer in which each rank wrote its pieces (stage3.py, zeropp.py)
    stage3_allgather_sequential
                          each parameter all-gathered on its own, no coalescing (zeropp.py)
    enable_sanity_checks  before each gradient's reduce-scatter the ranks compare the ds_ids
                          they are about to reduce (stage3.py): an all-gather, and a clear error
                          where the ranks' backward orders differ
    log_trace_cache_warnings
                          a warning each time the coordinator's trace is invalidated
                          (partitioned_param_coordinator.py)
    pipeline_loading_checkpoint
                          a node's ranks load their optimizer files one after another
                          (checkpoint/zero_checkpoint.py; the load refuses it below stage 3)
    override_module_apply read by DeepSpeed only inside ``with deepspeed.zero.Init()``, where
                          Module.apply gathers partitioned parameters while the model is built;
                          the engine partitions a model already built, there and here (minitron
                          has no zero.Init), so either value changes nothing
Accepted at DeepSpeed's default only (what minitron does; anything else is refused):
    zero_quantized_nontrainable_weights false
                          (minitron's stage 3 partitions trainable parameters only)
    memory_efficient_linear true
                          DeepSpeed swaps torch's F.linear for an autograd function that saves
                          the weight parameter, not a view of its gathered buffer; minitron's
                          linear layers (Megatron's) save the parameter already, and have no
                          torch F.linear path to switch back to
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from minitron.runtime.config_values import DeepSpeedConfigError, model_flag, model_int
from minitron.runtime.zero.leaf_module_config import DEFAULT_CLASSES, parse_leaf_module

INTS = {   # field: (alias, minitron's default); every one ge=0
    "prefetch_bucket_size": ("stage3_prefetch_bucket_size", 0),
    "param_persistence_threshold": ("stage3_param_persistence_threshold", 0),
    "model_persistence_threshold": ("stage3_model_persistence_threshold", sys.maxsize),
    "max_live_parameters": ("stage3_max_live_parameters", 1_000_000_000),
    "max_reuse_distance": ("stage3_max_reuse_distance", 0),
    "zero_hpz_partition_size": (None, 1),
    "sub_group_size": (None, 1_000_000_000),
    "module_granularity_threshold": ("stage3_module_granularity_threshold", 0),
}
# DeepSpeed's defaults where minitron's differ. With them a small model keeps every parameter
# whole (all under 1e5 elements), and from the second pass on gathers ahead and keeps a layer's
# weights from its forward to its backward. minitron's estimate (training/theoretical_zero.py)
# counts stage 3's gathers module by module, one before each forward and one before each
# backward; until it follows the coordinator's trace too, the knobs are off unless asked for,
# so that a config without them runs what the estimate counts.
DEEPSPEED_DEFAULTS = {"prefetch_bucket_size": 50_000_000, "param_persistence_threshold": 100_000,
                      "max_reuse_distance": 1_000_000_000}
FLAGS = {
    "zero_quantized_weights": (None, False),
    "zero_quantized_gradients": (None, False),
    "gather_16bit_weights_on_model_save": ("stage3_gather_16bit_weights_on_model_save", False),
    "use_all_reduce_for_fetch_params": ("stage3_use_all_reduce_for_fetch_params", False),
    "allgather_sequential": ("stage3_allgather_sequential", False),
    "enable_sanity_checks": (None, False),
    "log_trace_cache_warnings": (None, False),
    "override_module_apply": (None, True),
    "pipeline_loading_checkpoint": (None, False),
}
DEFAULT_ONLY = {"zero_quantized_nontrainable_weights": False,
                "memory_efficient_linear": True}
STAGE3_KEYS = tuple(k for table in (INTS, FLAGS) for name, (alias, _) in table.items()
                    for k in (name, alias) if k) + ("stage3_gather_fp16_weights_on_model_save", "leaf_module")


@dataclass(frozen=True)
class Stage3Config:
    prefetch_bucket_size: int = INTS["prefetch_bucket_size"][1]
    param_persistence_threshold: int = INTS["param_persistence_threshold"][1]
    model_persistence_threshold: int = INTS["model_persistence_threshold"][1]
    max_live_parameters: int = INTS["max_live_parameters"][1]
    max_reuse_distance: int = INTS["max_reuse_distance"][1]
    zero_hpz_partition_size: int = 1
    sub_group_size: int = 1_000_000_000
    zero_quantized_weights: bool = False
    zero_quantized_gradients: bool = False
    gather_16bit_weights_on_model_save: bool = False
    use_all_reduce_for_fetch_params: bool = False
    allgather_sequential: bool = False
    enable_sanity_checks: bool = False
    log_trace_cache_warnings: bool = False
    override_module_apply: bool = True
    pipeline_loading_checkpoint: bool = False
    module_granularity_threshold: int = 0
    leaf_module: tuple = (DEFAULT_CLASSES, (), ())   # (classes, names, name_suffixes): leaf_modules.py


def _one(zero: dict, name: str, alias, where: str) -> tuple:
    """(the key the section spells the field with, the section): the field's name or its alias,
    both refused; the name when neither is given (the default then stands)."""
    given = [k for k in (name, alias) if k and k in zero]
    if len(given) > 1:
        raise DeepSpeedConfigError(f"{where}: {given[0]!r} and {given[1]!r} are one field; keep one")
    return (given[0] if given else name), zero


def parse_stage3(zero: dict, where: str) -> Stage3Config:
    values = {}
    for name, (alias, default) in INTS.items():
        key, section = _one(zero, name, alias, where)
        values[name] = model_int(section, key, default, where, minimum=0)
    for name, (alias, default) in FLAGS.items():
        key, section = _one(zero, name, alias, where)
        values[name] = model_flag(section, key, default, where)
    if "stage3_gather_fp16_weights_on_model_save" in zero:   # DeepSpeed's deprecated name for the same field
        values["gather_16bit_weights_on_model_save"] = model_flag(
            zero, "stage3_gather_fp16_weights_on_model_save", False, where)
    values["leaf_module"] = parse_leaf_module(zero, where)
    return Stage3Config(**values)
