"""The ds_config's monitor sections (``deepspeed/monitor/config.py``): ``tensorboard``,
``csv_monitor`` and ``wandb``, each a pydantic model in DeepSpeed, so read here in the same lax
way as the fp16 and zero sections (config_values.py); an unknown key is refused, as DeepSpeed's
models forbid extra fields.

A monitor whose package is missing is refused here, in one line, before any rank starts:
DeepSpeed finds out only on rank 0, when it builds the writer. ``comet`` is the fourth section
DeepSpeed reads; minitron does not build it (comet_ml is a hosted service's client).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field
from typing import Optional

from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, json_value, model_flag, model_int, \
    model_view

# section -> (its fields and their DeepSpeed defaults, the package its writer needs)
SECTIONS = {
    "tensorboard": ({"enabled": False, "output_path": "", "job_name": "DeepSpeedJobName"}, "tensorboard"),
    "csv_monitor": ({"enabled": False, "output_path": "", "job_name": "DeepSpeedJobName"}, None),
    "wandb": ({"enabled": False, "group": None, "team": None, "project": "deepspeed"}, "wandb"),
}


@dataclass
class MonitorConfig:
    tensorboard: dict = field(default_factory=dict)
    csv_monitor: dict = field(default_factory=dict)
    wandb: dict = field(default_factory=dict)

    @property
    def enabled(self) -> bool:
        return any(section["enabled"] for section in (self.tensorboard, self.csv_monitor, self.wandb))


def parse_monitor(params: dict) -> MonitorConfig:
    out = {}
    for name, (defaults, package) in SECTIONS.items():
        section = params.get(name, {})
        if not isinstance(section, dict):
            raise DeepSpeedConfigError(f"{name} must be an object, got {json_value(section)}")
        section = model_view(section)
        check_keys(section, tuple(defaults), {}, name, model=True)
        values = dict(defaults, enabled=model_flag(section, "enabled", False, name))
        for key in defaults:
            if key != "enabled" and key in section:
                values[key] = _text(section[key], f"{name}.{key}", nullable=defaults[key] is None)
        if values["enabled"] and package and importlib.util.find_spec(package) is None:
            raise DeepSpeedConfigError(f"{name}.enabled needs the {package!r} package, which is not installed here "
                                       f"(pip install {package}); or set it to false")
        out[name] = values
    _comet(params)
    return MonitorConfig(**out)


# CometConfig's fields: a disabled section is still a pydantic model in DeepSpeed, which refuses a
# wrong kind of value or an unknown key in it, so minitron reads it as far as that before saying
# it does not build the monitor (scripts/ds_config_surface.py found these accepted here)
COMET = {"samples_log_interval": 100, "project": None, "workspace": None, "api_key": None, "experiment_name": None,
         "experiment_key": None, "mode": None}


def _comet(params: dict) -> None:
    comet = params.get("comet", {})
    if not isinstance(comet, dict):
        raise DeepSpeedConfigError(f"comet must be an object, got {json_value(comet)}")
    comet = model_view(comet)
    check_keys(comet, ("enabled", "online") + tuple(COMET), {}, "comet", model=True)
    model_int(comet, "samples_log_interval", 100, "comet", minimum=None)
    for key in COMET:
        if key != "samples_log_interval" and key in comet:
            _text(comet[key], f"comet.{key}", nullable=True)
    if comet.get("online") is not None:
        model_flag(comet, "online", False, "comet")
    if model_flag(comet, "enabled", False, "comet"):
        raise DeepSpeedConfigError("comet: the Comet monitor is not built in minitron; use tensorboard, csv_monitor "
                                   "or wandb")


def _text(value, name: str, nullable: bool) -> Optional[str]:
    """A ``str`` field (pydantic's strict-ish str: no numbers, no booleans)."""
    if value is None and nullable:
        return None
    if not isinstance(value, str):
        raise DeepSpeedConfigError(f"{name} must be a string, got {json_value(value)}")
    return value
