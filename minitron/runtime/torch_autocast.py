"""The ds_config's ``torch_autocast`` section: DeepSpeed 0.19.8's use of PyTorch's own mixed
precision (``deepspeed/runtime/torch_autocast.py``), instead of its fp16/bf16 sections.

    "torch_autocast": {"enabled": true, "dtype": "bfloat16",
                       "lower_precision_safe_modules": ["torch.nn.Linear"]}

What it changes, where DeepSpeed changes it:

    the forward    the engine runs the module inside ``torch.autocast(device, dtype)``: the
                   weights stay as they are (fp32, unless bf16 is enabled too), and the ops
                   autocast lists (matmuls, linear layers) compute in ``dtype``. Without a dtype,
                   torch's own default for the device (bfloat16 on the CPU).
    the wire       before ZeRO is built, every parameter of a module whose class is exactly one
                   of ``lower_precision_safe_modules`` (default: torch.nn.Linear and Conv1d/2d/3d;
                   a subclass does not count) is marked with that dtype. ZeRO 1-3 then reduce each
                   gradient in its parameter's mark, the others in their own dtype, in one bucket
                   per dtype (zero/buckets.py); ``communication_data_type`` is no longer read
                   there. Stage 0 reduces as without autocast: its all-reduce is the engine's,
                   which reads no mark.

fp16 pairs autocast with ``torch.amp.GradScaler`` (a loss scale that skips steps) in DeepSpeed;
minitron's engine does not build that scaler, so the config refuses dtype fp16. DeepSpeed also
refuses autocast beside ZeRO++'s quantized weights (their int8 gather knows no per-parameter
dtype); so does the config.
"""

from __future__ import annotations

import importlib
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Optional

from minitron.runtime.config_values import DeepSpeedConfigError, check_keys, flag, json_value

# (torch is imported where a tensor is touched: `minitron ds-config` reads the section without it)
LOWER_PRECISION_SAFE_MODULES = ("torch.nn.Linear", "torch.nn.Conv1d", "torch.nn.Conv2d", "torch.nn.Conv3d")
# DeepSpeed's DtypeEnum spellings of the dtypes torch.autocast takes, by torch's name
DTYPES = {"bfloat16": ("torch.bfloat16", "bf16", "bfloat16"), "float16": ("torch.float16", "fp16", "float16", "half"),
          "float32": ("torch.float32", "fp32", "float32", "float")}
PARAM_COMM_DTYPE_ATTR_NAME = "comm_dtype"   # DeepSpeed's attribute: ZeRO reads it off the parameter


@dataclass
class TorchAutocastConfig:
    enabled: bool = False
    dtype_name: Optional[str] = None   # "bfloat16", "float32"; None: torch's default for the device
    lower_precision_safe_modules: Optional[list] = None   # None: LOWER_PRECISION_SAFE_MODULES

    @property
    def dtype(self):
        import torch   # lazy: the section is read without torch (ds-config, the launcher's checks)
        return None if self.dtype_name is None else getattr(torch, self.dtype_name)

    def as_dict(self) -> dict:
        return {"enabled": self.enabled, "dtype": self.dtype_name,
                "lower_precision_safe_modules": self.lower_precision_safe_modules}


def parse_torch_autocast(params: dict, zero_quantized_weights: bool = False) -> TorchAutocastConfig:
    section = params.get("torch_autocast", {})
    if not isinstance(section, dict):
        raise DeepSpeedConfigError(f"torch_autocast must be an object, got {json_value(section)}")
    check_keys(section, ("enabled", "dtype", "lower_precision_safe_modules"), {}, "torch_autocast")
    enabled = flag(section, "enabled", False, "torch_autocast")   # read raw (get_scalar_param), as DeepSpeed
    for key in ("dtype", "lower_precision_safe_modules"):
        if key in section and section[key] is None:   # DeepSpeed fails on an explicit null for either
            raise DeepSpeedConfigError(f"torch_autocast.{key} is null; leave the key out for DeepSpeed's default")
    dtype = section.get("dtype")
    if dtype is not None:
        dtype = next((d for d, names in DTYPES.items() if dtype in names), None)
        if dtype is None:
            raise DeepSpeedConfigError(f"torch_autocast.dtype must be bfloat16 (or bf16, torch.bfloat16) or fp32, "
                                       f"got {json_value(section['dtype'])}")
    modules = section.get("lower_precision_safe_modules")
    if modules is not None and not (isinstance(modules, list) and all(isinstance(m, str) for m in modules)):
        raise DeepSpeedConfigError(f"torch_autocast.lower_precision_safe_modules must be a list of class names "
                                   f"(\"torch.nn.Linear\"), got {json_value(modules)}")
    if enabled and dtype == "float16":
        raise DeepSpeedConfigError("torch_autocast.dtype fp16: DeepSpeed pairs it with torch.amp.GradScaler (a loss "
                                   "scale that skips steps), which minitron's engine does not build; use bfloat16")
    if enabled and zero_quantized_weights:   # DeepSpeed's _validate_auto_cast_settings
        raise DeepSpeedConfigError("torch_autocast with zero_optimization.zero_quantized_weights: DeepSpeed refuses "
                                   "the pair (cannot enable both); drop one")
    if enabled and modules:   # DeepSpeed imports them when the engine starts; here before any rank does
        for name in modules:
            _import_class(name)
    return TorchAutocastConfig(enabled, dtype, modules)


def _import_class(name: str) -> type:
    package, _, class_name = name.rpartition(".")
    try:
        return getattr(importlib.import_module(package), class_name)
    except (ImportError, AttributeError, ValueError) as missing:
        raise DeepSpeedConfigError(f"torch_autocast.lower_precision_safe_modules: cannot import {name!r} ({missing}); "
                                   f"name a class by its module path, as \"torch.nn.Linear\"") from None


def init_autocast_params(module, config: TorchAutocastConfig) -> int:
    """Mark the parameters of the lower-precision-safe modules with the autocast dtype (the
    dtype their gradients will cross the data-parallel group in); returns how many."""
    names = config.lower_precision_safe_modules
    classes = tuple(_import_class(n) for n in (LOWER_PRECISION_SAFE_MODULES if names is None else names))
    marked = 0
    for sub in module.modules():
        if type(sub) in classes:   # the class itself, as DeepSpeed's `in` list test: a subclass is not safe by name
            for p in sub.parameters(recurse=False):
                setattr(p, PARAM_COMM_DTYPE_ATTR_NAME, config.dtype)
                marked += 1
    return marked


def comm_dtype(param):
    """The dtype ``param``'s gradient is reduced in under autocast: its mark, else its own
    (a mark of None, autocast without a dtype, is the gradient's own dtype too)."""
    return getattr(param, PARAM_COMM_DTYPE_ATTR_NAME, param.dtype)


_WARNED_NESTED_AUTOCAST = False


def warn_nested_autocast(enabled: bool) -> None:
    """Once per process, on rank 0: the caller's torch.autocast is overridden by the section."""
    global _WARNED_NESTED_AUTOCAST
    if _WARNED_NESTED_AUTOCAST:
        return
    _WARNED_NESTED_AUTOCAST = True
    # lazy: this module's top is the config's reader, which stays torch-free; comm and the
    # engine's logger (runtime/utils.py) import torch
    from minitron import comm as dist
    from minitron.runtime.utils import logger
    if dist.get_rank() != 0:
        return
    if enabled:
        logger.info("torch.autocast is already enabled outside the engine; the torch_autocast section of the "
                    "ds_config decides inside it")
    else:
        logger.warning("torch.autocast is enabled outside the engine but the ds_config's torch_autocast is not: the "
                       "engine turns it off for the forward (the fp16/bf16 sections decide); configure "
                       "torch_autocast to use torch's autocast")


@contextmanager
def autocast_if_enabled(config: TorchAutocastConfig, device_type: str, warn):
    """The forward's context: the section's autocast when enabled. A caller that already runs
    under torch.autocast gets the section's setting instead of its own (on when enabled, off
    when not), with one warning, as DeepSpeed does."""
    import torch   # lazy: as dtype above
    try:
        outer = torch.is_autocast_enabled(device_type)
    except RuntimeError:   # a device type torch has no autocast for (meta): no caller's autocast to find
        if config.enabled:
            raise
        outer = False
    if outer:
        warn(config.enabled)
    if config.enabled:
        with torch.autocast(device_type=device_type, dtype=config.dtype, enabled=True):
            yield
    elif outer:
        with torch.autocast(device_type=device_type, enabled=False):
            yield
    else:
        yield
