"""A ds_config's ``scheduler.type`` that is none of DeepSpeed's five: torch's, taken by name
(DeepSpeed 0.19.8's ``engine._scheduler_from_config``), checked before any rank starts.

DeepSpeed looks the name up in its own lr_schedules first and then in
``torch.optim.lr_scheduler``, as written ("StepLR", not "steplr"), and calls the class with the
engine's optimizer and the config's params, unread. Two consequences a user meets:

* torch's schedulers accept a torch optimizer only (``LRScheduler.__init__`` checks
  ``isinstance(optimizer, torch.optim.Optimizer)``). DeepSpeed hands them ``engine.optimizer``,
  which is the basic optimizer itself only in fp32 without ZeRO; with ZeRO (stage 1-3), fp16 or
  bf16 it is DeepSpeed's wrapper (DeepSpeedZeroOptimizer, FP16_Optimizer, BF16_Optimizer...),
  and initialize fails with torch's TypeError "... is not an Optimizer". The same configs are
  refused here, with that reason. (minitron's engine always wraps; where DeepSpeed would not, it
  hands the schedule the basic optimizer, whose param groups are the wrapper's.)
* the engine steps the schedule once per applied optimizer step with no argument: a schedule
  whose step() needs one (ReduceLROnPlateau's metric) fails at the first step there.
"""

from __future__ import annotations

from minitron.runtime.config_values import DeepSpeedConfigError, json_value
from minitron.runtime.torch_names import may_be_exported, spelled_as

FAILS_AT_STEP = {"ReduceLROnPlateau": "its step() needs the metric to watch, which DeepSpeed's engine never passes"}


def resolve(kind) -> str | None:
    """``kind`` when torch.optim.lr_scheduler has a schedule of that exact name, else None."""
    if not isinstance(kind, str) or not may_be_exported("torch.optim.lr_scheduler", kind):
        return None   # a name torch lacks is refused without importing it
    import torch   # only for a config whose scheduler is none of DeepSpeed's: ds-config stays torch-free
    cls = getattr(torch.optim.lr_scheduler, kind, None)
    schedules = (torch.optim.lr_scheduler.LRScheduler, torch.optim.lr_scheduler.ReduceLROnPlateau)
    return kind if isinstance(cls, type) and issubclass(cls, schedules) else None


def refuse_unknown(kind, own: tuple) -> None:
    """A type that is neither DeepSpeed's nor torch's: DeepSpeed's assertion, as one line."""
    hint = ""
    case = spelled_as("torch.optim.lr_scheduler", kind) if isinstance(kind, str) else None
    if case:
        hint = f"; torch's are looked up by their exact name: write {case!r}"
    raise DeepSpeedConfigError(f"scheduler.type {json_value(kind)} is neither DeepSpeed's ({', '.join(own)}) nor a "
                               f"torch.optim.lr_scheduler schedule{hint}")


def check(kind: str, params: dict) -> None:
    """Build the schedule once on a one-parameter SGD (momentum 0.9, so a schedule that cycles
    momentum finds one): a key torch's constructor does not take, or a value it refuses, is one line."""
    if kind in FAILS_AT_STEP:
        raise DeepSpeedConfigError(f"scheduler.type {kind!r}: DeepSpeed builds torch's {kind} and fails at the first "
                                   f"step ({FAILS_AT_STEP[kind]}); name another schedule")
    import torch   # lazy: a ds_config is read without torch; only a trial build of a torch schedule needs it
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1, momentum=0.9)   # host: a trial build
    try:
        getattr(torch.optim.lr_scheduler, kind)(optimizer, **params)
    except (TypeError, ValueError, KeyError, ZeroDivisionError) as exc:
        reason = " ".join(str(exc).split())
        raise DeepSpeedConfigError(f"scheduler.params {json_value(params)} for torch's {kind}: {reason}") from None


def check_wrapped(kind: str, stage: int, fp16: bool, bf16: bool) -> None:
    """DeepSpeed's TypeError where its engine.optimizer is a wrapper, not a torch optimizer."""
    wrapper = f"ZeRO stage {stage}" if stage > 0 else "fp16" if fp16 else "bf16" if bf16 else None
    if wrapper is not None:
        raise DeepSpeedConfigError(f"scheduler.type {kind!r} is torch's, which schedules a torch optimizer only; with "
                                   f"{wrapper} DeepSpeed hands it its optimizer wrapper and initialize fails (\"... is "
                                   f"not an Optimizer\"); use one of DeepSpeed's schedules (WarmupLR, WarmupDecayLR, "
                                   f"WarmupCosineLR, OneCycle, LRRangeTest), or fp32 without ZeRO")


def build(kind: str, optimizer, params: dict):
    import torch   # lazy: as in check()
    return getattr(torch.optim.lr_scheduler, kind)(optimizer, **params)
