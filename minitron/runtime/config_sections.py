"""The ds_config's sections other than the batch triad: precision, scheduler, ZeRO (the optimizer:
``config_optimizer.py``).

Defaults are DeepSpeed's (deepspeed/runtime/constants.py, zero/config.py, lr_schedules.py). Each
parser refuses what minitron does not run — other optimizers, other schedules — with
one line, instead of accepting a key and doing nothing with it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Optional

from minitron.runtime import torch_schedules
from minitron.runtime.zero.offload_config import OFFLOAD_KEYS, OffloadConfig, parse_offload
from minitron.runtime.zero.stage_1_and_2_config import KNOB_KEYS, parse_stage_1_and_2
from minitron.runtime.zero.stage3_config import DEFAULT_ONLY as STAGE3_DEFAULT_ONLY, STAGE3_KEYS, Stage3Config, \
    parse_stage3
from minitron.runtime.precision_config import BF16_OPTIONS, FP16_OPTIONS
from minitron.runtime.config_values import (  # noqa: F401 -- DeepSpeedConfigError re-exported
    DeepSpeedConfigError, check_keys, flag, json_value, model_flag, model_int, model_number, model_view, number,
    positive_int,
)


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
    fp16 = model_view(_section(params, "fp16"))
    check_keys(fp16, FP16_KEYS + tuple(FP16_OPTIONS), {}, "fp16", model=True)   # options: precision_config.py
    bf16_key = "bf16" if "bf16" in params else "bfloat16"  # DeepSpeed still reads the old name
    bf16 = model_view(_section(params, bf16_key))
    check_keys(bf16, ("enabled",) + tuple(BF16_OPTIONS), {}, bf16_key, model=True)
    fp16_on, bf16_on = model_flag(fp16, "enabled", False, "fp16"), model_flag(bf16, "enabled", False, bf16_key)
    if fp16_on and bf16_on:
        raise DeepSpeedConfigError("fp16.enabled and bf16.enabled are both true; choose one")
    if not fp16_on:
        return Precision(False, bf16_on, 1.0 if bf16_on else 0.0, 1.0 if bf16_on else 2.0 ** 16, None)
    loss_scale = model_number(fp16, "loss_scale", 0, "fp16", low=0)
    # DeepSpeed checks the window and the floor (> 0) only for dynamic scaling (loss_scale 0):
    # a static scale never uses them. Both refuse true/false, and min_loss_scale is an int
    # there: 0.5 is refused ("a number with a fractional part").
    floor = 1 if loss_scale == 0 else -2**63
    # 2**power must be a normal fp32 number: DeepSpeed takes 1024 too, and then every step
    # overflows until the scaler has halved its way below 2**128 (some 900 skipped steps).
    power = model_int(fp16, "initial_scale_power", 16, "fp16", minimum=-126, maximum=127)
    args = {
        "init_scale": 2.0 ** power,
        "scale_window": model_int(fp16, "loss_scale_window", 1000, "fp16", minimum=floor, bools=False),
        "delayed_shift": model_int(fp16, "hysteresis", 2, "fp16"),
        "consecutive_hysteresis": model_flag(fp16, "consecutive_hysteresis", False, "fp16"),
        "min_scale": model_int(fp16, "min_loss_scale", 1, "fp16", minimum=floor, bools=False),
    }
    return Precision(True, False, loss_scale, 2.0 ** power, args)


# --- optimizer and scheduler ------------------------------------------------------------------

# DeepSpeed's five schedules and the constructor arguments a config may give each (DeepSpeed
# validates nothing before calling the constructor: an unknown key is its TypeError).
_WARMUP = ("warmup_min_lr", "warmup_max_lr", "warmup_num_steps", "warmup_type")
SCHEDULERS = {"WarmupLR": _WARMUP,
              "WarmupDecayLR": _WARMUP + ("total_num_steps",),
              "WarmupCosineLR": ("total_num_steps", "warmup_min_ratio", "warmup_num_steps", "cos_min_ratio",
                                 "warmup_type"),
              "OneCycle": ("cycle_min_lr", "cycle_max_lr", "decay_lr_rate", "cycle_first_step_size",
                           "cycle_second_step_size", "cycle_first_stair_count", "cycle_second_stair_count",
                           "decay_step_size", "cycle_momentum", "cycle_min_mom", "cycle_max_mom", "decay_mom_rate"),
              "LRRangeTest": ("lr_range_test_min_lr", "lr_range_test_step_size", "lr_range_test_step_rate",
                              "lr_range_test_staircase")}


def _typed_section(params: dict, key: str, kinds: dict, any_case: tuple = ()) -> tuple[Optional[str], dict]:
    """``{"type": ..., "params": {...}}`` sections: the type (one minitron runs) and its params.
    ``any_case``: the names DeepSpeed lower-cases before it compares ("adam", "ADAM" and "Adam"
    are one optimizer); any other name is looked up as written."""
    section = _section(params, key)
    if not section:
        return None, {}
    check_keys(section, ("type", "params"), {}, key)
    kind = section.get("type")
    if isinstance(kind, str) and kind.lower() in {name.lower() for name in any_case}:
        # Resolved to minitron's spelling (DeepSpeed keeps "adam"): the engine tells AdamW by it.
        kind = {name.lower(): name for name in any_case}[kind.lower()]
    if not isinstance(kind, str) or kind not in kinds:  # (a list or an object cannot even be looked up)
        case = next((n for n in kinds if isinstance(kind, str) and n.lower() == kind.lower()), None)
        why = f"; DeepSpeed looks a torch optimizer up by its exact name: write {case!r}" if case else ""
        raise DeepSpeedConfigError(f"{key}.type {json_value(kind)}: minitron runs {', '.join(kinds)}{why}")
    return kind, _section(section, "params")


def parse_scheduler(params: dict) -> tuple[Optional[str], Optional[dict]]:
    """The schedule and its constructor's arguments, DeepSpeed's defaults filled in. DeepSpeed
    lets its constructors find bad values (or not: a string step size fails at the first step);
    here each is refused with its name before anything runs. Per-param-group lists, which the
    constructors also take, are not read: one value for every group."""
    kind = _section(params, "scheduler").get("type")
    if isinstance(kind, str) and kind not in SCHEDULERS and torch_schedules.resolve(kind) is not None:   # torch's, by its exact name
        check_keys(_section(params, "scheduler"), ("type", "params"), {}, "scheduler")
        sched = dict(_section(_section(params, "scheduler"), "params"))
        torch_schedules.check(kind, sched)   # config.py refuses it where DeepSpeed's optimizer is a wrapper
        return kind, sched
    if "type" in _section(params, "scheduler") and not (isinstance(kind, str) and kind in SCHEDULERS):
        torch_schedules.refuse_unknown(kind, tuple(SCHEDULERS))
    kind, sched = _typed_section(params, "scheduler", SCHEDULERS)
    if kind is None:
        return None, None
    where = "scheduler.params"
    check_keys(sched, SCHEDULERS[kind], {}, where)
    parse = {"WarmupLR": _warmup, "WarmupDecayLR": _warmup, "WarmupCosineLR": _warmup_cosine,
             "OneCycle": _one_cycle, "LRRangeTest": _range_test}[kind]
    return kind, parse(kind, sched, where)


def _warmup_type(sched: dict, where: str) -> str:
    kind = sched.get("warmup_type", "log")
    if kind not in ("log", "linear"):
        # DeepSpeed warns and falls back to log; a silent change of schedule is worse than a refusal.
        raise DeepSpeedConfigError(f"{where}.warmup_type must be \"log\" or \"linear\", got {json_value(kind)}")
    return kind


def _total_steps(kind: str, sched: dict, where: str) -> int:
    if "total_num_steps" not in sched:
        raise DeepSpeedConfigError(f"{where}.total_num_steps is required by {kind}")
    return positive_int(sched, "total_num_steps", where=where)


def _warmup(kind: str, sched: dict, where: str) -> dict:
    out = {"warmup_min_lr": number(sched, "warmup_min_lr", 0.0, where, low=0),
           # Absent, WarmupLR warms each param group up to its own lr (DeepSpeed 0.19.4+: None);
           # WarmupDecayLR still defaults to 0.001.
           "warmup_max_lr": number(sched, "warmup_max_lr", 0.001, where, low=0)
           if "warmup_max_lr" in sched or kind == "WarmupDecayLR" else None,
           # DeepSpeed's WarmupLR refuses 0 ("must be a positive integer"), then warms up over
           # max(2, n) steps: the value here is the one given, as DeepSpeed's config keeps it.
           "warmup_num_steps": positive_int(sched, "warmup_num_steps", where=where)
           if "warmup_num_steps" in sched else 1000,
           "warmup_type": _warmup_type(sched, where)}
    if kind == "WarmupDecayLR":
        out["total_num_steps"] = _total_steps(kind, sched, where)
    return out


def _warmup_cosine(kind: str, sched: dict, where: str) -> dict:
    return {"total_num_steps": _total_steps(kind, sched, where),
            "warmup_min_ratio": number(sched, "warmup_min_ratio", 0.0, where, low=0),
            "warmup_num_steps": positive_int(sched, "warmup_num_steps", where=where)
            if "warmup_num_steps" in sched else 1000,
            "cos_min_ratio": number(sched, "cos_min_ratio", 0.0001, where, low=0),
            "warmup_type": _warmup_type(sched, where)}


def _range_test(kind: str, sched: dict, where: str) -> dict:
    return {"lr_range_test_min_lr": number(sched, "lr_range_test_min_lr", 1e-3, where, low=0),
            "lr_range_test_step_size": positive_int(sched, "lr_range_test_step_size", where=where)
            if "lr_range_test_step_size" in sched else 2000,
            "lr_range_test_step_rate": number(sched, "lr_range_test_step_rate", 1.0, where),
            "lr_range_test_staircase": flag(sched, "lr_range_test_staircase", False, where)}


def _one_cycle(kind: str, sched: dict, where: str) -> dict:
    for key in ("cycle_min_lr", "cycle_max_lr"):   # the constructor has no default for either
        if key not in sched:
            raise DeepSpeedConfigError(f"{where}.{key} is required by OneCycle")
    out = {"cycle_min_lr": number(sched, "cycle_min_lr", 0.0, where, low=0),
           "cycle_max_lr": number(sched, "cycle_max_lr", 0.0, where, low=0),
           "decay_lr_rate": number(sched, "decay_lr_rate", 0.0, where),
           # DeepSpeed float()s the half-cycle lengths and needs first > 0 (it divides by it).
           "cycle_first_step_size": number(sched, "cycle_first_step_size", 2000, where, low=0),
           "cycle_second_step_size": number(sched, "cycle_second_step_size", 0, where, low=0)
           if sched.get("cycle_second_step_size") is not None else None,
           "cycle_first_stair_count": positive_int(sched, "cycle_first_stair_count", where=where, minimum=0)
           if "cycle_first_stair_count" in sched else 0,
           "cycle_second_stair_count": positive_int(sched, "cycle_second_stair_count", where=where, minimum=0)
           if sched.get("cycle_second_stair_count") is not None else None,
           "decay_step_size": positive_int(sched, "decay_step_size", where=where, minimum=0)
           if "decay_step_size" in sched else 0,
           "cycle_momentum": flag(sched, "cycle_momentum", True, where),
           "cycle_min_mom": number(sched, "cycle_min_mom", 0.8, where, low=0, high=1),
           "cycle_max_mom": number(sched, "cycle_max_mom", 0.9, where, low=0, high=1),
           "decay_mom_rate": number(sched, "decay_mom_rate", 0.0, where)}
    if out["cycle_first_step_size"] == 0:
        raise DeepSpeedConfigError(f"{where}.cycle_first_step_size must be positive, got 0")
    return out


# --- ZeRO ------------------------------------------------------------------------------------

DEFAULT_BUCKET = 500_000_000  # DeepSpeed's pp_int(5e8), for both bucket sizes


@dataclass
class ZeroConfig:
    stage: int = 0
    reduce_bucket_size: int = DEFAULT_BUCKET
    allgather_bucket_size: int = DEFAULT_BUCKET
    overlap_comm: bool = False
    contiguous_gradients: bool = True
    reduce_scatter: bool = True
    allgather_partitions: bool = True
    round_robin_gradients: bool = False
    compute_grad_norm: bool = True   # these five: zero/stage_1_and_2_config.py
    use_multi_rank_bucket_allreduce: bool = True
    load_from_fp32_weights: bool = True
    ignore_unused_parameters: bool = True
    elastic_checkpoint: bool = False
    # ZeRO-Offload / ZeRO-Infinity (zero/offload_config.py): None when not asked for
    offload_optimizer: Optional[OffloadConfig] = None
    offload_param: Optional[OffloadConfig] = None
    # stage 3's knobs and ZeRO++ (zero/stage3_config.py)
    stage3: Stage3Config = Stage3Config()

    def as_dict(self) -> dict:
        return asdict(self)


ZERO_KEYS = ("stage", "reduce_bucket_size", "allgather_bucket_size", "overlap_comm", "contiguous_gradients",
             "reduce_scatter", "allgather_partitions", "round_robin_gradients")


def parse_zero(params: dict) -> ZeroConfig:
    where = "zero_optimization"
    zero = model_view(_section(params, where))
    check_keys({k: v for k, v in zero.items() if k not in OFFLOAD_KEYS}, ZERO_KEYS + KNOB_KEYS + STAGE3_KEYS,
               STAGE3_DEFAULT_ONLY,
               where, model=True)
    try:  # pydantic's int enum: 1.0, "1" and true are all stage 1
        stage = model_int(zero, "stage", 0, where, minimum=0, maximum=3)
    except DeepSpeedConfigError:
        raise DeepSpeedConfigError(f"{where}.stage must be 0, 1, 2 or 3, got {json_value(zero['stage'])}") from None
    # DeepSpeed's fields: reduce_bucket_size gt=0, allgather_bucket_size ge=0.
    reduce_size = model_int(zero, "reduce_bucket_size", DEFAULT_BUCKET, where)
    allgather = model_int(zero, "allgather_bucket_size", DEFAULT_BUCKET, where, minimum=0)
    # Optional[bool]: null leaves DeepSpeed's default, on for stage 3 only (overlap_comm_valid)
    overlap = model_flag(zero, "overlap_comm", stage == 3, where) if zero.get("overlap_comm") is not None \
        else stage == 3
    # overlap_comm runs at every ZeRO stage (zero/buckets.py, zero/stage3.py): the reductions
    # are launched during backward and waited for after it. allgather_bucket_size is accepted
    # and, as in DeepSpeed 0.19.8, read by nothing: with torch's all_gather_into_tensor (any
    # torch since 1.13) its all_gather_dp_groups gathers each flat group in one call. So is
    # allgather_partitions: 0.19.8's engine has an accessor for it that nothing calls, and every
    # rank all-gathers the updated partitions whatever it says.
    # contiguous_gradients and reduce_scatter choose how ZeRO 1-2 reduce (runtime/gradient_reduction.py);
    # round_robin_gradients deals the parameters to the ranks' partitions in turn (stage_1_and_2.py).
    # DeepSpeed reads them at stages 1-2 (reduce_scatter also at 3, where it only guards the checks
    # in config.py); elsewhere they are accepted and change nothing, there as here.
    flags = {key: model_flag(zero, key, default, where) for key, default in (
        ("contiguous_gradients", True), ("reduce_scatter", True), ("allgather_partitions", True),
        ("round_robin_gradients", False))}
    offload_optimizer, offload_param = parse_offload(zero, stage, where)
    return ZeroConfig(stage, reduce_size, allgather, overlap, **flags, offload_optimizer=offload_optimizer,
                      offload_param=offload_param, stage3=parse_stage3(zero, where),
                      **parse_stage_1_and_2(zero, stage, params, offload_optimizer, where))
