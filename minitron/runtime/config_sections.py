"""The ds_config's sections other than the batch triad: precision, optimizer, scheduler, ZeRO.

Defaults are DeepSpeed's (deepspeed/runtime/constants.py, zero/config.py, lr_schedules.py). Each
parser refuses what minitron does not run — offloading, other optimizers, other schedules — with
one line, instead of accepting a key and doing nothing with it.
"""

from __future__ import annotations

import difflib
import math
from dataclasses import asdict, dataclass
from typing import Any, Optional


class DeepSpeedConfigError(ValueError):
    """A bad ds_config value; the message is one line naming the key."""


def check_keys(section: dict, known: tuple, default_only: dict, where: str) -> None:
    """Refuse keys minitron does not read. ``default_only`` keys are accepted at DeepSpeed's
    default value only (it is what minitron does anyway), so real configs that spell the
    default out still load."""
    for key, value in section.items():
        if key in known:
            continue
        if key in default_only:
            if value != default_only[key] or isinstance(value, bool) != isinstance(default_only[key], bool):
                raise DeepSpeedConfigError(f"{where}.{key}: minitron implements only {json_value(default_only[key])} "
                                           f"(DeepSpeed's default), got {json_value(value)}")
            continue
        close = difflib.get_close_matches(key, list(known) + list(default_only), n=1, cutoff=0.7)
        hint = f"; did you mean {close[0]!r}?" if close else f"; minitron reads {', '.join(known)}"
        raise DeepSpeedConfigError(f"{where}: unknown key {key!r}{hint}")


def json_value(value: Any) -> str:
    return "true" if value is True else "false" if value is False else repr(value)


def positive_int(section: dict, key: str, allow_none: bool = False, where: str = "", minimum: int = 1) -> Optional[int]:
    value = section.get(key)
    name = f"{where}.{key}" if where else key
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise DeepSpeedConfigError(f"{name} must be a whole number, got {json_value(value)}")
    if allow_none and key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        return value  # the triad checks its own signs, with DeepSpeed's messages
    if value < minimum:
        raise DeepSpeedConfigError(f"{name} must be at least {minimum}, got {value}")
    return value


def number(section: dict, key: str, default: float, where: str, low: float = -math.inf,
           high: float = math.inf) -> float:
    value = section.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
        raise DeepSpeedConfigError(f"{where}.{key} must be a number in [{low}, {high}], got {json_value(value)}")
    return float(value)


def flag(section: dict, key: str, default: bool, where: str) -> bool:
    value = section.get(key, default)
    if not isinstance(value, bool):
        raise DeepSpeedConfigError(f"{where}.{key} must be true or false, got {json_value(value)}")
    return value


def _section(params: dict, key: str) -> dict:
    value = params.get(key, {})
    if not isinstance(value, dict):
        raise DeepSpeedConfigError(f"{key} must be an object, got {json_value(value)}")
    return value


# --- fp16 / bf16 ---------------------------------------------------------------------------

FP16_KEYS = ("enabled", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
             "consecutive_hysteresis", "min_loss_scale")


@dataclass
class Precision:
    fp16: bool
    bf16: bool
    loss_scale: float          # 0: dynamic (fp16); bf16 needs no scaling, so 1.0
    initial_scale: float       # 2 ** initial_scale_power
    dynamic_args: Optional[dict]


def parse_precision(params: dict) -> Precision:
    fp16 = _section(params, "fp16")
    check_keys(fp16, FP16_KEYS, {"fp16_master_weights_and_grads": False, "auto_cast": False}, "fp16")
    bf16_key = "bf16" if "bf16" in params else "bfloat16"  # DeepSpeed still reads the old name
    bf16 = _section(params, bf16_key)
    check_keys(bf16, ("enabled",), {"immediate_grad_update": False}, bf16_key)
    fp16_on, bf16_on = flag(fp16, "enabled", False, "fp16"), flag(bf16, "enabled", False, bf16_key)
    if fp16_on and bf16_on:
        raise DeepSpeedConfigError("fp16.enabled and bf16.enabled are both true; choose one")
    if not fp16_on:
        return Precision(False, bf16_on, 1.0 if bf16_on else 0.0, 1.0 if bf16_on else 2.0 ** 16, None)
    power = positive_int(fp16, "initial_scale_power", where="fp16", minimum=0) if "initial_scale_power" in fp16 else 16
    args = {
        "init_scale": 2.0 ** power,
        "scale_window": positive_int(fp16, "loss_scale_window", where="fp16") if "loss_scale_window" in fp16 else 1000,
        "delayed_shift": positive_int(fp16, "hysteresis", where="fp16") if "hysteresis" in fp16 else 2,
        "consecutive_hysteresis": flag(fp16, "consecutive_hysteresis", False, "fp16"),
        "min_scale": number(fp16, "min_loss_scale", 1, "fp16", low=0, high=math.inf),
    }
    if args["min_scale"] <= 0:
        raise DeepSpeedConfigError("fp16.min_loss_scale must be greater than 0")
    loss_scale = number(fp16, "loss_scale", 0, "fp16", low=0)
    return Precision(True, False, loss_scale, 2.0 ** power, args)


# --- optimizer and scheduler ------------------------------------------------------------------

OPTIMIZERS = {"Adam": ("lr", "betas", "eps", "weight_decay"), "AdamW": ("lr", "betas", "eps", "weight_decay")}
SCHEDULERS = {"WarmupLR": ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"),
              "WarmupDecayLR": ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                "total_num_steps")}


def _typed_section(params: dict, key: str, kinds: dict) -> tuple[Optional[str], dict]:
    """``{"type": ..., "params": {...}}`` sections: the type (one minitron runs) and its params."""
    section = _section(params, key)
    if not section:
        return None, {}
    check_keys(section, ("type", "params"), {}, key)
    kind = section.get("type")
    if kind not in kinds:
        raise DeepSpeedConfigError(f"{key}.type {json_value(kind)}: minitron runs {' or '.join(kinds)}")
    return kind, _section(section, "params")


def parse_optimizer(params: dict) -> tuple[Optional[str], Optional[dict]]:
    """Adam or AdamW with their params; None when the program passes its own optimizer."""
    kind, opt = _typed_section(params, "optimizer", OPTIMIZERS)
    if kind is None:
        return None, None
    check_keys(opt, OPTIMIZERS[kind] + ("adam_w_mode",), {"torch_adam": False}, "optimizer.params")
    out = {"lr": number(opt, "lr", 1e-3, "optimizer.params", low=0),
           "eps": number(opt, "eps", 1e-8, "optimizer.params", low=0),
           "weight_decay": number(opt, "weight_decay", 0.0, "optimizer.params", low=0)}
    betas = opt.get("betas", [0.9, 0.999])
    if (not isinstance(betas, list) or len(betas) != 2
            or not all(isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b < 1 for b in betas)):
        raise DeepSpeedConfigError(f"optimizer.params.betas must be two numbers in [0, 1), got {json_value(betas)}")
    out["betas"] = [float(b) for b in betas]
    if "adam_w_mode" in opt:   # DeepSpeed's "Adam" is AdamW unless this is false; "AdamW" always is
        out["adam_w_mode"] = flag(opt, "adam_w_mode", True, "optimizer.params")
    return kind, out


def parse_scheduler(params: dict) -> tuple[Optional[str], Optional[dict]]:
    kind, sched = _typed_section(params, "scheduler", SCHEDULERS)
    if kind is None:
        return None, None
    where = "scheduler.params"
    check_keys(sched, SCHEDULERS[kind], {}, where)
    out = {"warmup_min_lr": number(sched, "warmup_min_lr", 0.0, where, low=0),
           "warmup_max_lr": number(sched, "warmup_max_lr", 0.001, where, low=0),
           "warmup_num_steps": positive_int(sched, "warmup_num_steps", where=where, minimum=0)
           if "warmup_num_steps" in sched else 1000,
           "warmup_type": sched.get("warmup_type", "log")}
    if out["warmup_type"] not in ("log", "linear"):
        # DeepSpeed warns and falls back to log; a silent change of schedule is worse than a refusal.
        raise DeepSpeedConfigError(f"{where}.warmup_type must be \"log\" or \"linear\", got {json_value(out['warmup_type'])}")
    if kind == "WarmupDecayLR":
        if "total_num_steps" not in sched:
            raise DeepSpeedConfigError(f"{where}.total_num_steps is required by WarmupDecayLR")
        out["total_num_steps"] = positive_int(sched, "total_num_steps", where=where)
    return kind, out


# --- ZeRO ------------------------------------------------------------------------------------

@dataclass
class ZeroConfig:
    stage: int = 0
    reduce_bucket_size: int = 500_000_000
    allgather_bucket_size: int = 500_000_000
    overlap_comm: bool = False
    contiguous_gradients: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


ZERO_KEYS = ("stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients")
OFFLOAD_KEYS = ("offload_param", "offload_optimizer", "cpu_offload", "cpu_offload_params")


def parse_zero(params: dict) -> ZeroConfig:
    zero = _section(params, "zero_optimization")
    for key in OFFLOAD_KEYS:
        value = zero.get(key)
        if value not in (None, False, {}) and not (isinstance(value, dict) and value.get("device", "none") == "none"):
            raise DeepSpeedConfigError(f"zero_optimization.{key}: offloading to CPU or NVMe is not implemented in "
                                       f"minitron; remove it (or set it to false)")
    check_keys({k: v for k, v in zero.items() if k not in OFFLOAD_KEYS}, ZERO_KEYS,
               {"allgather_partitions": True, "reduce_scatter": True}, "zero_optimization")
    stage = zero.get("stage", 0)
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise DeepSpeedConfigError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {json_value(stage)}")
    buckets = {key: positive_int(zero, key, where="zero_optimization", minimum=0) if key in zero else 500_000_000
               for key in ("reduce_bucket_size", "allgather_bucket_size")}
    # DeepSpeed's default for overlap_comm depends on the stage: on for stage 3 only.
    overlap = zero.get("overlap_comm")
    overlap = stage == 3 if overlap is None else flag(zero, "overlap_comm", False, "zero_optimization")
    return ZeroConfig(stage, buckets["reduce_bucket_size"], buckets["allgather_bucket_size"], overlap,
                      flag(zero, "contiguous_gradients", True, "zero_optimization"))
