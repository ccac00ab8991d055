"""The ds_config's ``activation_checkpointing`` section, DeepSpeed 0.19.8's six keys and defaults
(its activation_checkpointing/config.py).

DeepSpeed reads each key raw (``get_scalar_param``) and never checks it: a string where a bool
belongs is simply truthy there. Here each key is checked by name before any rank starts, and the
one combination DeepSpeed's ``configure`` stops on (contiguous buffers without partitioning) is
refused in one line. The engine itself never reads this section: ``deepspeed.checkpointing.
configure`` does, and Megatron-DeepSpeed calls it only with --deepspeed-activation-checkpointing
(training/initialize.py here).
"""

from __future__ import annotations

from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, flag, json_value, positive_int

SECTION = "activation_checkpointing"
DEFAULTS = {"partition_activations": False, "number_checkpoints": None, "contiguous_memory_optimization": False,
            "synchronize_checkpoint_boundary": False, "profile": False, "cpu_checkpointing": False}


def parse_activation_checkpointing(params: dict) -> dict:
    """The section with DeepSpeed's defaults filled in (all of them when it is absent)."""
    section = params.get(SECTION, {})
    if not isinstance(section, dict):
        raise DeepSpeedConfigError(f"{SECTION} must be an object, got {json_value(section)}")
    check_keys(section, tuple(DEFAULTS), {}, SECTION)
    out = {key: flag(section, key, default, SECTION) for key, default in DEFAULTS.items() if key != "number_checkpoints"}
    # How many checkpoints one forward makes: the size of the contiguous buffers' list. None lets
    # the caller count them (Megatron-DeepSpeed passes ceil(layers / layers per checkpoint)).
    out["number_checkpoints"] = positive_int(section, "number_checkpoints", allow_none=True, where=SECTION)
    if out["contiguous_memory_optimization"] and not out["partition_activations"]:
        # DeepSpeed's configure asserts this: the buffers are sized for one partition each.
        raise DeepSpeedConfigError(f"{SECTION}.contiguous_memory_optimization copies each partitioned activation "
                                   "into preallocated buffers, so DeepSpeed requires partition_activations: true "
                                   "with it; set that too, or drop contiguous_memory_optimization")
    return out
