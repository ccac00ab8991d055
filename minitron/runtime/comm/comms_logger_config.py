"""The ds_config's ``comms_logger`` section (DeepSpeed's ``deepspeed/comm/config.py``; here, under runtime/,
because it reads the config with config_values.py, a floor above minitron.comm).

DeepSpeed's comms logger times every collective that passes through ``deepspeed.comm`` and
prints a table of latency and bandwidth per operation. minitron does not build it: its trace
records every collective of every rank, with group and shapes, whatever the config says. A
section that leaves the logger off asks for nothing, so it is read as DeepSpeed's pydantic
model reads it (the same keys, the same kinds, lax bools) and accepted; ``"enabled": true``
asks for the table and is refused.
"""

from __future__ import annotations

from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, json_value, model_flag, model_view

COMMS_LOGGER_FLAGS = {"enabled": False, "prof_all": True, "verbose": False, "debug": False}   # DeepSpeed's defaults


def parse_comms_logger(params: dict) -> None:
    section = params.get("comms_logger", {})
    if not isinstance(section, dict):
        raise DeepSpeedConfigError(f"comms_logger must be an object, got {json_value(section)}")
    section = model_view(section)
    check_keys(section, tuple(COMMS_LOGGER_FLAGS) + ("prof_ops",), {}, "comms_logger", model=True)
    flags = {key: model_flag(section, key, default, "comms_logger") for key, default in COMMS_LOGGER_FLAGS.items()}
    if not isinstance(section.get("prof_ops", []), list):   # the op names to time, when prof_all is false
        raise DeepSpeedConfigError(f"comms_logger.prof_ops must be a list of operation names, got "
                                   f"{json_value(section['prof_ops'])}")
    if flags["enabled"]:
        raise DeepSpeedConfigError("comms_logger.enabled: DeepSpeed's comms logger is not built in minitron; "
                                   "`minitron trace` records every collective of every rank; set it to false")
