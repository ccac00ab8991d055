"""DeepSpeed's warm-up schedules, WarmupLR, WarmupDecayLR and WarmupCosineLR
(``deepspeed/runtime/lr_schedules.py``; OneCycle and LRRangeTest are in lr_schedules_cycle.py).

Both move every param group's ``lr`` from ``warmup_min_lr`` to ``warmup_max_lr`` over
``warmup_num_steps`` optimizer steps, along a curve ``gamma`` in [0, 1]:

    lr = min_lr + (max_lr - min_lr) * gamma(t)        t = last_batch_iteration

    log     gamma(t) = log(t + 1) / log(warmup_num_steps)     fast at first, then flattening
    linear  gamma(t) = t / warmup_num_steps

WarmupLR then stays at max_lr; WarmupDecayLR falls linearly to 0 at ``total_num_steps``:

    gamma(t) = max(0, (total_num_steps - t) / max(1, total_num_steps - warmup_num_steps))

Without ``warmup_max_lr``, WarmupLR warms each param group up to the ``lr`` it already has
(DeepSpeed since 0.17.2; before 0.19.4 every group took group 0's); WarmupDecayLR still
defaults to 0.001.

Two details a reader meets in the numbers. ``warmup_num_steps`` is raised to at least 2 (log(1)
is 0, and the log curve divides by it). And the scheduler sets ``lr`` once at construction with
t = -1, which DeepSpeed answers with min_lr; the engine steps the scheduler after every applied
optimizer step, so step 1 runs at min_lr (t = -1), step 2 at gamma(0) = 0 (min_lr again: log(1)
and 0/N are both 0), and the curve shows from step 3 on. A step skipped for an fp16 overflow
does not step the scheduler.

WarmupCosineLR works in ratios of each group's own lr instead (its class says how).
"""

from __future__ import annotations

import math

from minitron.runtime.lr_schedules_cycle import LRRangeTest, OneCycle, Schedule, per_group, torch_optimizer, update_lr


class WarmupLR(Schedule):
    def __init__(self, optimizer, warmup_min_lr: float = 0.0, warmup_max_lr: float | list | None = None,
                 warmup_num_steps: int = 1000, warmup_type: str = "log", last_batch_iteration: int = -1):
        # DeepSpeed refuses 0 here (and so WarmupDecayLR's 0), though max(2, n) below would run it.
        if not isinstance(warmup_num_steps, int) or warmup_num_steps <= 0:
            raise ValueError(f"warmup_num_steps must be a positive integer, got {warmup_num_steps}")
        if warmup_type not in ("log", "linear"):
            raise ValueError(f'warmup_type must be "log" or "linear", got {warmup_type!r}')
        self.optimizer = optimizer = torch_optimizer(optimizer)
        if warmup_max_lr is None:   # warm up to the lr each param group was given (DeepSpeed 0.19.4+)
            warmup_max_lr = [group["lr"] for group in optimizer.param_groups]
        self.min_lrs = per_group(optimizer, warmup_min_lr, "warmup_min_lr")
        self.max_lrs = per_group(optimizer, warmup_max_lr, "warmup_max_lr")
        self.delta_lrs = [high - low for high, low in zip(self.max_lrs, self.min_lrs)]
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._last_lr = update_lr(optimizer.param_groups, self.get_lr())

    def _get_gamma(self) -> float:
        t = self.last_batch_iteration
        if t < self.warmup_num_steps:
            if self.warmup_type == "log":
                return self.inverse_log_warm_up * math.log(t + 1)
            return t / self.warmup_num_steps
        return 1.0

    def get_lr(self) -> list:
        if self.last_batch_iteration < 0:
            return list(self.min_lrs)   # before the first step (DeepSpeed also warns here)
        gamma = self._get_gamma()
        return [low + delta * gamma for low, delta in zip(self.min_lrs, self.delta_lrs)]

    def load_state_dict(self, state: dict) -> None:
        # Also writes the lr back (DeepSpeed leaves that to the optimizer's own state_dict).
        super().load_state_dict(state)
        self._last_lr = update_lr(self.optimizer.param_groups, self.get_lr())


class WarmupDecayLR(WarmupLR):
    def __init__(self, optimizer, total_num_steps: int, warmup_min_lr: float = 0.0,
                 warmup_max_lr: float = 0.001, warmup_num_steps: int = 1000, warmup_type: str = "log",
                 last_batch_iteration: int = -1):
        self.total_num_steps = total_num_steps
        super().__init__(optimizer, warmup_min_lr, warmup_max_lr, warmup_num_steps, warmup_type,
                         last_batch_iteration)

    def _get_gamma(self) -> float:
        if self.last_batch_iteration < self.warmup_num_steps:
            return super()._get_gamma()
        remaining = self.total_num_steps - self.last_batch_iteration
        return max(0.0, remaining / max(1.0, self.total_num_steps - self.warmup_num_steps))


class WarmupCosineLR(Schedule):
    """Ratios of the lr each param group was given (``org_lrs``), not lrs: the warm-up goes from
    ``warmup_min_ratio`` to 1 along the same log or linear curve, then a half cosine falls to
    ``cos_min_ratio`` at ``total_num_steps`` and stays there:

        ratio = cos_min_ratio + (1 - cos_min_ratio) * (1 + cos(pi * p)) / 2
        p     = min(1, (t - warmup_num_steps + 1) / max(1, total_num_steps - warmup_num_steps))

    Before the first step (t = -1) the ratio is 0, not warmup_min_ratio: step 1 runs at lr 0.
    """

    def __init__(self, optimizer, total_num_steps: int, warmup_min_ratio: float = 0.0, warmup_num_steps: int = 1000,
                 cos_min_ratio: float = 0.0001, warmup_type: str = "log", last_batch_iteration: int = -1):
        if not isinstance(warmup_num_steps, int) or warmup_num_steps <= 0:
            raise ValueError(f"warmup_num_steps must be a positive integer, got {warmup_num_steps}")
        if warmup_type not in ("log", "linear"):
            raise ValueError(f'warmup_type must be "log" or "linear", got {warmup_type!r}')
        self.optimizer = torch_optimizer(optimizer)
        self.total_num_steps = total_num_steps
        self.warmup_min_ratio = warmup_min_ratio
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.cos_min_ratio = cos_min_ratio
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.org_lrs = [group["lr"] for group in self.optimizer.param_groups]
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._last_lr = update_lr(self.optimizer.param_groups, self.get_lr())

    def get_lr_ratio(self) -> float:
        t = self.last_batch_iteration
        if t < 0:
            return 0.0
        if t < self.warmup_num_steps:
            rise = self.inverse_log_warm_up * math.log(t + 1) if self.warmup_type == "log" \
                else t / self.warmup_num_steps
            return self.warmup_min_ratio + rise * (1.0 - self.warmup_min_ratio)
        progress = min(1.0, (t - self.warmup_num_steps + 1) / max(1, self.total_num_steps - self.warmup_num_steps))
        return max(0.0, self.cos_min_ratio + (1.0 - self.cos_min_ratio) * (1 + math.cos(math.pi * progress)) / 2)

    def get_lr(self) -> list:
        ratio = self.get_lr_ratio()
        return [lr * ratio for lr in self.org_lrs]



# DeepSpeed's five (VALID_LR_SCHEDULES), by the names a ds_config's scheduler.type gives.
SCHEDULERS = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR, "WarmupCosineLR": WarmupCosineLR,
              "OneCycle": OneCycle, "LRRangeTest": LRRangeTest}
