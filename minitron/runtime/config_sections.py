"""The ds_config's sections other than the batch triad: precision, optimizer, scheduler, ZeRO.

Defaults are DeepSpeed's (deepspeed/runtime/constants.py, zero/config.py, lr_schedules.py). Each
parser refuses what minitron does not run — offloading, other optimizers, other schedules — with
one line, instead of accepting a key and doing nothing with it.
"""

from __future__ import annotations

import difflib
import json
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
    """The value as the JSON file spells it, cut short (a 4,000-digit number stays one line)."""
    if isinstance(value, bool) or value is None:
        text = json.dumps(value)
    elif isinstance(value, float) and not math.isfinite(value):
        text = "NaN" if value != value else "Infinity" if value > 0 else "-Infinity"
    elif isinstance(value, int) and value.bit_length() > 256:  # repr itself refuses past 4300 digits
        text = f"an integer of {int(value.bit_length() * math.log10(2)) + 1} digits"
    else:
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def positive_int(section: dict, key: str, allow_none: bool = False, where: str = "", minimum: int = 1,
                 maximum: Optional[int] = None, lax: bool = False) -> Optional[int]:
    """A whole number. ``lax``: a key DeepSpeed reads through a pydantic ``int`` field, which
    takes a whole float of any size too (a file's ``2e10`` stays a float after hjson, see
    config.hjson_number); the batch keys are read raw, where a float stays a float."""
    value = section.get(key)
    name = f"{where}.{key}" if where else key
    if value is None and allow_none:
        return None
    if lax and type(value) is float and math.isfinite(value) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        why = " (hjson, DeepSpeed's reader, makes whole numbers below 1e10 integers; this stays a float)" \
            if type(value) is float and math.isfinite(value) and value.is_integer() else ""
        raise DeepSpeedConfigError(f"{name} must be a whole number, got {json_value(value)}{why}")
    if allow_none and key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"):
        return value  # the triad checks its own signs, with DeepSpeed's messages
    if value < minimum:
        raise DeepSpeedConfigError(f"{name} must be at least {minimum}, got {value}")
    if maximum is not None and value > maximum:
        raise DeepSpeedConfigError(f"{name} must be at most {maximum}, got {value}")
    return value


def number(section: dict, key: str, default: float, where: str, low: float = -math.inf,
           high: float = math.inf) -> float:
    """A finite number in [low, high]. Not finite is never a value DeepSpeed takes: its reader
    (hjson) has no Infinity or NaN, and reads 1e400 as an error."""
    value = section.get(key, default)
    name = f"{where}.{key}" if where else key
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) \
            or not low <= value <= high:
        bounds = f" in [{low:g}, {high:g}]" if math.isfinite(high) else f" >= {low:g}" if math.isfinite(low) else ""
        raise DeepSpeedConfigError(f"{name} must be a finite number{bounds}, got {json_value(value)}")
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
    loss_scale = number(fp16, "loss_scale", 0, "fp16", low=0)
    # DeepSpeed reads these through pydantic int fields and checks the window and the floor
    # (> 0) only for dynamic scaling (loss_scale 0): a static scale never uses them.
    dynamic = loss_scale == 0
    floor = 1 if dynamic else -2**63
    # 2**power must be a finite fp32 number: DeepSpeed takes 1024 too, and then every step
    # overflows until the scaler has halved its way below 2**128 (some 900 skipped steps).
    power = positive_int(fp16, "initial_scale_power", where="fp16", minimum=0, maximum=127, lax=True) \
        if "initial_scale_power" in fp16 else 16
    args = {
        "init_scale": 2.0 ** power,
        "scale_window": positive_int(fp16, "loss_scale_window", where="fp16", minimum=floor, lax=True)
        if "loss_scale_window" in fp16 else 1000,
        "delayed_shift": positive_int(fp16, "hysteresis", where="fp16", lax=True) if "hysteresis" in fp16 else 2,
        "consecutive_hysteresis": flag(fp16, "consecutive_hysteresis", False, "fp16"),
        # an int in DeepSpeed: 0.5 is refused there ("a number with a fractional part")
        "min_scale": positive_int(fp16, "min_loss_scale", where="fp16", minimum=floor, lax=True)
        if "min_loss_scale" in fp16 else 1,
    }
    return Precision(True, False, loss_scale, 2.0 ** power, args)


# --- optimizer and scheduler ------------------------------------------------------------------

OPTIMIZERS = {"Adam": ("lr", "betas", "eps", "weight_decay"), "AdamW": ("lr", "betas", "eps", "weight_decay")}
SCHEDULERS = {"WarmupLR": ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type"),
              "WarmupDecayLR": ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type",
                                "total_num_steps")}


def _typed_section(params: dict, key: str, kinds: dict, any_case: bool = False) -> tuple[Optional[str], dict]:
    """``{"type": ..., "params": {...}}`` sections: the type (one minitron runs) and its params.
    ``any_case``: DeepSpeed lower-cases an optimizer's name before it compares ("adam", "ADAM"
    and "Adam" are one optimizer); a scheduler's name is looked up as written."""
    section = _section(params, key)
    if not section:
        return None, {}
    check_keys(section, ("type", "params"), {}, key)
    kind = section.get("type")
    if any_case and isinstance(kind, str):
        # Resolved to minitron's spelling (DeepSpeed keeps "adam"): the engine tells AdamW by it.
        kind = {name.lower(): name for name in kinds}.get(kind.lower(), kind)
    if not isinstance(kind, str) or kind not in kinds:  # (a list or an object cannot even be looked up)
        raise DeepSpeedConfigError(f"{key}.type {json_value(kind)}: minitron runs {' or '.join(kinds)}")
    return kind, _section(section, "params")


def parse_optimizer(params: dict) -> tuple[Optional[str], Optional[dict]]:
    """Adam or AdamW with their params; None when the program passes its own optimizer."""
    kind, opt = _typed_section(params, "optimizer", OPTIMIZERS, any_case=True)
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
           # DeepSpeed's WarmupLR refuses 0 ("must be a positive integer"), then warms up over
           # max(2, n) steps: the value here is the one given, as DeepSpeed's config keeps it.
           "warmup_num_steps": positive_int(sched, "warmup_num_steps", where=where)
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

DEFAULT_BUCKET = 500_000_000  # DeepSpeed's pp_int(5e8), for both bucket sizes


@dataclass
class ZeroConfig:
    stage: int = 0
    reduce_bucket_size: int = DEFAULT_BUCKET
    allgather_bucket_size: int = DEFAULT_BUCKET
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
    if type(stage) is float and stage.is_integer():
        stage = int(stage)  # pydantic's int enum takes a whole float; a file's 1.0 is 1 already
    if isinstance(stage, bool) or stage not in (0, 1, 2, 3):
        raise DeepSpeedConfigError(f"zero_optimization.stage must be 0, 1, 2 or 3, got {json_value(stage)}")
    where = "zero_optimization"
    # DeepSpeed's fields: reduce_bucket_size gt=0, allgather_bucket_size ge=0.
    reduce_size = positive_int(zero, "reduce_bucket_size", where=where, lax=True) \
        if "reduce_bucket_size" in zero else DEFAULT_BUCKET
    allgather = positive_int(zero, "allgather_bucket_size", where=where, minimum=0, lax=True) \
        if "allgather_bucket_size" in zero else DEFAULT_BUCKET
    overlap = flag(zero, "overlap_comm", stage == 3, where)  # DeepSpeed's default: on for stage 3 only
    contiguous = flag(zero, "contiguous_gradients", True, where)
    if stage > 0:  # at stage 0 DeepSpeed runs no ZeRO optimizer, and reads none of them either
        _not_modelled(where, {"allgather_bucket_size": (allgather, DEFAULT_BUCKET), "overlap_comm": (overlap, stage == 3),
                              "contiguous_gradients": (contiguous, True)}, stage)
    return ZeroConfig(stage, reduce_size, allgather, overlap, contiguous)


def _not_modelled(where: str, given: dict, stage: int) -> None:
    """Keys minitron parses and runs nothing for: minitron's ZeRO all-gathers updated weights
    in one call per group, reduces each gradient bucket as it fills (no second stream to overlap
    on) and keeps each gradient where autograd put it. Each is accepted at DeepSpeed's default only,
    which is then what minitron does anyway."""
    for key, (value, default) in given.items():
        if value != default:
            raise DeepSpeedConfigError(f"{where}.{key}: {json_value(value)} is not modelled in minitron, which "
                                       f"runs DeepSpeed's default at stage {stage} ({json_value(default)}); "
                                       f"remove it or set it to {json_value(default)}")
