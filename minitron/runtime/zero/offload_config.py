"""``zero_optimization.offload_optimizer`` / ``offload_param`` and the deprecated keys that
stand for them: DeepSpeed 0.19.8's ``zero/offload_config.py`` and the deprecation rules of its
``zero/config.py``, read into two small dataclasses.

What each key does here (the ZeRO optimizers read them: zero/offload.py):

    device        "cpu": the fp32 master, the optimizer's moments and its step live in host
                  memory (offload_param: stage 3's pieces); "nvme" at stage 3 also swaps them
                  to files under nvme_path between steps (swap_tensor/). DeepSpeed's stages
                  1-2 ask only "device != none", so "nvme" there is the CPU case, as here
    pin_memory    host tensors are page-locked on CUDA (copies can run asynchronously); a CPU
                  rank has no device to copy to, so nothing is pinned there
    buffer_count  the swapper's pool of aligned I/O buffers (nvme): a step needs one per
                  swapped tensor of a group (offload_param: a gather one per swapped piece
                  it reads), and stops with a clear line when it has fewer
    ratio         < 1 offloads part of the states (stage 3 only in DeepSpeed): refused, not built
    pipeline_read, pipeline_write
                  nvme at stage 3: read the next sub-group's files while this one steps, and
                  write this one's while the next steps (swap_tensor/pipelined_optimizer_swapper.py);
                  DeepSpeed reads them only when it swaps, so with device cpu they change nothing
    super_offload the Grace-Hopper superchip's optimizer: refused, not built
    buffer_size, max_in_cpu
                  offload_param nvme: the elements one swap buffer holds (a bigger piece is
                  refused when stage 3 starts, as DeepSpeed asserts it), and the elements kept
                  in host memory before sub-groups go to files
                  (swap_tensor/partitioned_param_swapper.py); with device cpu they change
                  nothing, as in DeepSpeed
    fast_init     offload_optimizer nvme with parameters on NVMe too: DeepSpeed fills the
                  optimizer's swap files from the parameters' buffers instead of one host
                  copy; the same files result, so minitron accepts it and reads as without
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from minitron.runtime.config_values import (
    DeepSpeedConfigError, check_keys, json_value, lax_bool, model_flag, model_int, model_view, number,
)

DEVICES = ("none", "cpu", "nvme")
PARAM_KEYS = ("device", "nvme_path", "buffer_count", "buffer_size", "max_in_cpu", "pin_memory")
OPTIMIZER_KEYS = ("device", "nvme_path", "buffer_count", "pin_memory", "pipeline_read", "pipeline_write",
                  "fast_init", "ratio", "super_offload", "cpuadam_cores_perc")
# The deprecated booleans: which new section each sets when true (DeepSpeed's new_param_fn).
DEPRECATED = {"cpu_offload": "offload_optimizer", "cpu_offload_param": "offload_param"}
OFFLOAD_KEYS = ("offload_param", "offload_optimizer", "cpu_offload", "cpu_offload_param", "cpu_offload_use_pin_memory")


@dataclass
class OffloadConfig:
    device: str = "none"
    nvme_path: Optional[str] = None
    buffer_count: int = 4
    pin_memory: bool = True
    buffer_size: int = 100_000_000   # offload_param only, as the two below
    max_in_cpu: int = 1_000_000_000
    fast_init: bool = False
    ratio: float = 1.0
    pipeline_read: bool = False    # offload_optimizer only: swap_tensor/pipelined_optimizer_swapper.py
    pipeline_write: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def _section(zero: dict, key: str, keys: tuple, where: str) -> Optional[dict]:
    value = zero.get(key)
    if value is None:
        return None
    if not isinstance(value, dict):
        raise DeepSpeedConfigError(f"{where}.{key} must be an object such as {{\"device\": \"cpu\"}}, got "
                                   f"{json_value(value)}")
    section = model_view(value)
    check_keys(section, keys, {}, f"{where}.{key}", model=True)
    return section


def _device(section: dict, where: str) -> str:
    device = section.get("device", "none")
    if device not in DEVICES:
        raise DeepSpeedConfigError(f"{where}.device must be \"none\", \"cpu\" or \"nvme\", got {json_value(device)}")
    return device


def _common(section: dict, where: str, buffer_count: int) -> OffloadConfig:
    device = _device(section, where)
    path = section.get("nvme_path")
    if path is not None and not isinstance(path, str):
        raise DeepSpeedConfigError(f"{where}.nvme_path must be a folder's path, got {json_value(path)}")
    if device == "nvme" and not path:
        # DeepSpeed joins the swap folder onto it and fails with a TypeError deep in stage3.py.
        raise DeepSpeedConfigError(f"{where}.device \"nvme\" needs nvme_path: the folder the swap files go to")
    return OffloadConfig(device=device, nvme_path=path,
                         buffer_count=model_int(section, "buffer_count", buffer_count, where, minimum=0),
                         pin_memory=model_flag(section, "pin_memory", True, where))


def parse_offload_param(section: dict, where: str) -> OffloadConfig:
    where = f"{where}.offload_param"
    out = _common(section, where, buffer_count=5)
    out.buffer_size = model_int(section, "buffer_size", out.buffer_size, where, minimum=0)
    out.max_in_cpu = model_int(section, "max_in_cpu", out.max_in_cpu, where, minimum=0)
    return out


def parse_offload_optimizer(section: dict, where: str, stage: int) -> OffloadConfig:
    where = f"{where}.offload_optimizer"
    out = _common(section, where, buffer_count=4)
    out.fast_init = model_flag(section, "fast_init", False, where)
    out.ratio = number(section, "ratio", 1.0, where, low=0, high=1)
    number(section, "cpuadam_cores_perc", 0.8, where, low=0, high=1)   # super_offload's knob; checked only
    if out.ratio < 1 and stage != 3:   # DeepSpeed's offload_ratio_check
        raise DeepSpeedConfigError(f"{where}.ratio {out.ratio:g}: partial offloading is only supported for ZeRO "
                                   "stage 3 (DeepSpeed's assertion); use 1.0")
    if out.ratio < 1:
        raise DeepSpeedConfigError(f"{where}.ratio {out.ratio:g}: partial offloading (part of the states stepped "
                                   "on the GPU) is not built in minitron; use 1.0")
    out.pipeline_read = model_flag(section, "pipeline_read", False, where)
    out.pipeline_write = model_flag(section, "pipeline_write", False, where)
    if model_flag(section, "super_offload", False, where):
        # DeepSpeed's SuperOffloadOptimizer_Stage3 steps on the Grace CPU of a Grace-Hopper
        # superchip beside the GPU's own step, which needs that chip's coherent memory.
        raise DeepSpeedConfigError(f"{where}.super_offload is the Superchip (Grace-Hopper) optimizer, which needs "
                                   "NVLink-C2C's shared CPU-GPU memory and is not built in minitron; remove it")
    if out.device != "none" and stage == 0:
        # DeepSpeed builds CPU-Adam, then steps it on parameters left on the GPU: its first step
        # fails there ("CPUAdam param is on cuda"). Offloading is a ZeRO optimizer's business.
        raise DeepSpeedConfigError(f"{where}: offloading the optimizer needs ZeRO stage 1, 2 or 3 (at stage 0 "
                                   "DeepSpeed's CPU-Adam fails on the GPU's parameters); raise the stage")
    return out


def parse_offload(zero: dict, stage: int, where: str = "zero_optimization") -> tuple[Optional[OffloadConfig],
                                                                                       Optional[OffloadConfig]]:
    """(offload_optimizer, offload_param), each None when absent or null; the deprecated
    ``cpu_offload`` / ``cpu_offload_param`` (true: the section with device "cpu", false or
    null: none) stand in for them, and may not come together with them, as in DeepSpeed."""
    sections = {"offload_optimizer": _section(zero, "offload_optimizer", OPTIMIZER_KEYS, where),
                "offload_param": _section(zero, "offload_param", PARAM_KEYS, where)}
    for old, new in DEPRECATED.items():
        if old not in zero:
            continue
        if new in zero:
            raise DeepSpeedConfigError(f"{where}: cannot provide deprecated parameter {old!r} and replacing "
                                       f"parameter {new!r} together (DeepSpeed's rule); keep {new!r}")
        value = zero[old]
        on = False if value is None else lax_bool(value)
        if on is None:
            raise DeepSpeedConfigError(f"{where}.{old} must be true or false, got {json_value(value)}")
        sections[new] = {"device": "cpu"} if on else None
    if zero.get("cpu_offload_use_pin_memory") is not None:   # deprecated with nothing to set: no effect
        model_flag(zero, "cpu_offload_use_pin_memory", False, where)
    optimizer, param = sections["offload_optimizer"], sections["offload_param"]
    return (None if optimizer is None else parse_offload_optimizer(optimizer, where, stage),
            None if param is None else parse_offload_param(param, where))


def offloaded(config: Optional[OffloadConfig]) -> bool:
    return config is not None and config.device != "none"
