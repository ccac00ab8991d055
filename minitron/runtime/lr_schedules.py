"""DeepSpeed's WarmupLR and WarmupDecayLR (``deepspeed/runtime/lr_schedules.py``).

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
"""

from __future__ import annotations

import math


def update_lr(param_groups: list, lrs: list) -> list:
    for group, lr in zip(param_groups, lrs):
        group["lr"] = lr
    return [group["lr"] for group in param_groups]


class WarmupLR:
    def __init__(self, optimizer, warmup_min_lr: float = 0.0, warmup_max_lr: float | list | None = None,
                 warmup_num_steps: int = 1000, warmup_type: str = "log", last_batch_iteration: int = -1):
        if warmup_type not in ("log", "linear"):
            raise ValueError(f'warmup_type must be "log" or "linear", got {warmup_type!r}')
        self.optimizer = optimizer
        groups = len(optimizer.param_groups)
        if warmup_max_lr is None:   # warm up to the lr each param group was given (DeepSpeed 0.19.4+)
            warmup_max_lr = [group["lr"] for group in optimizer.param_groups]
        self.min_lrs = self._per_group(warmup_min_lr, groups, "warmup_min_lr")
        self.max_lrs = self._per_group(warmup_max_lr, groups, "warmup_max_lr")
        self.delta_lrs = [high - low for high, low in zip(self.max_lrs, self.min_lrs)]
        self.warmup_num_steps = max(2, warmup_num_steps)
        self.warmup_type = warmup_type
        self.inverse_log_warm_up = 1.0 / math.log(self.warmup_num_steps)
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:
            self._last_lr = update_lr(optimizer.param_groups, self.get_lr())

    @staticmethod
    def _per_group(value, groups: int, name: str) -> list:
        if isinstance(value, (list, tuple)):
            if len(value) != groups:
                raise ValueError(f"{name}: {len(value)} values for {groups} param groups")
            return list(value)
        return [value] * groups

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

    def get_last_lr(self) -> list:
        return self._last_lr

    def step(self, last_batch_iteration: int | None = None) -> None:
        if last_batch_iteration is None:
            last_batch_iteration = self.last_batch_iteration + 1
        self.last_batch_iteration = last_batch_iteration
        self._last_lr = update_lr(self.optimizer.param_groups, self.get_lr())

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.last_batch_iteration = state["last_batch_iteration"]
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


SCHEDULERS = {"WarmupLR": WarmupLR, "WarmupDecayLR": WarmupDecayLR}
