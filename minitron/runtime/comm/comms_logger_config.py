"""The ds_config's ``comms_logger`` section (DeepSpeed's ``deepspeed/comm/config.py``; here, under runtime/,
because it reads the config with config_values.py, a floor above minitron.comm).

DeepSpeed's comms logger times every collective that passes through ``deepspeed.comm``
(minitron/utils/comms_logging.py; ``dist.log_summary()`` prints its table). The section is read as
DeepSpeed's pydantic model reads it (the same keys, the same kinds, lax bools), and turned on as
DeepSpeed 0.19.8 turns it on: ``DeepSpeedCommsConfig`` sets ``comms_logger_enabled`` to whether
the section is *present*, and ``CommsLogger.configure`` takes that, not the ``enabled`` key, so
``{"comms_logger": {"enabled": false}}`` logs too. Without the section nothing is timed.
"""

from __future__ import annotations

from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, json_value, model_flag, model_view

COMMS_LOGGER_FLAGS = {"enabled": False, "prof_all": True, "verbose": False, "debug": False}   # DeepSpeed's defaults


def parse_comms_logger(params: dict) -> dict:
    """What minitron.comm.configure takes: enabled (the section is there), prof_all, prof_ops
    (the op names timed when prof_all is false), verbose (a line per op on rank 0), debug (the
    caller's name in each log name)."""
    present = "comms_logger" in params
    section = params.get("comms_logger", {})
    if not isinstance(section, dict):
        raise DeepSpeedConfigError(f"comms_logger must be an object, got {json_value(section)}")
    section = model_view(section)
    check_keys(section, tuple(COMMS_LOGGER_FLAGS) + ("prof_ops",), {}, "comms_logger", model=True)
    flags = {key: model_flag(section, key, default, "comms_logger") for key, default in COMMS_LOGGER_FLAGS.items()}
    prof_ops = section.get("prof_ops", [])
    if not isinstance(prof_ops, list):
        raise DeepSpeedConfigError(f"comms_logger.prof_ops must be a list of operation names, got {json_value(prof_ops)}")
    if not present:   # DeepSpeed leaves its logger's defaults alone: off
        return {**COMMS_LOGGER_FLAGS, "prof_ops": []}
    return {**flags, "enabled": True, "prof_ops": list(prof_ops)}
