"""The ds_config's ``flops_profiler`` section (``deepspeed/profiling/config.py``, defaults from its
constants.py). DeepSpeed reads each key raw and lets a bad value fail later, mid-run; here each is
checked by name before any rank starts."""

from __future__ import annotations

from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, flag, json_value, number, positive_int

DEFAULTS = {"enabled": False, "recompute_fwd_factor": 0.0, "profile_step": 1, "module_depth": -1, "top_modules": 1,
            "detailed": True, "output_file": None}


def parse_flops_profiler(params: dict) -> dict:
    where = "flops_profiler"
    section = params.get(where, {})
    if not isinstance(section, dict):
        raise DeepSpeedConfigError(f"{where} must be an object, got {json_value(section)}")
    check_keys(section, tuple(DEFAULTS), {}, where)
    out = dict(DEFAULTS)
    out["enabled"] = flag(section, "enabled", False, where)
    out["detailed"] = flag(section, "detailed", True, where)
    # the backward's extra forwards when activations are recomputed (1.0: full recomputation)
    out["recompute_fwd_factor"] = number(section, "recompute_fwd_factor", 0.0, where, low=0)
    for key, low in (("profile_step", 0), ("module_depth", -1), ("top_modules", 0)):
        if key in section:   # profile_step is compared with global_steps, which starts at 0
            out[key] = positive_int(section, key, where=where, minimum=low)
    output_file = section.get("output_file")
    if output_file is not None and not isinstance(output_file, str):
        raise DeepSpeedConfigError(f"{where}.output_file must be a path or null, got {json_value(output_file)}")
    out["output_file"] = output_file or None   # DeepSpeed prints to stdout for "" too
    return out
