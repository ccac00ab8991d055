"""DeepSpeed's LRRangeTest and OneCycle (``deepspeed/runtime/lr_schedules.py``), and the helpers
every schedule there shares.

Both come from Leslie Smith's "A disciplined approach to neural network hyper-parameters"
(arXiv 1803.09820). The range test raises the lr steadily from a small value; the step at which
the loss starts to diverge tells the largest lr the model tolerates, which then bounds a cycle.
OneCycle runs one such cycle, up from ``cycle_min_lr`` to ``cycle_max_lr`` and back down, then
(optionally) decays below the minimum. Momentum (Adam's beta1) moves the opposite way: high while
the lr is low, low at the peak, because a large lr together with a large momentum overshoots.

Like every DeepSpeed schedule, t = ``last_batch_iteration`` is -1 at construction and the engine
adds 1 after each applied optimizer step; both schedules here compute from t + 1. Unlike WarmupLR,
``load_state_dict`` only restores t: the lr itself comes back with the optimizer's param groups,
and the next ``step`` recomputes it.
"""

from __future__ import annotations

import math

import torch


def update_lr(param_groups: list, lrs: list) -> list:
    for group, lr in zip(param_groups, lrs):
        group["lr"] = lr
    return [group["lr"] for group in param_groups]


def per_group(optimizer, value, name: str) -> list:
    """DeepSpeed's ``_format_param``: one value for every param group, or a list with one each."""
    groups = len(optimizer.param_groups)
    if isinstance(value, (list, tuple)):
        if len(value) != groups:
            raise ValueError(f"expected {groups} value for {name}, got {len(value)}")
        return list(value)
    return [value] * groups


def torch_optimizer(optimizer):
    """The torch optimizer under a ZeRO wrapper (DeepSpeed's ``get_torch_optimizer``): its
    ``defaults`` tell whether it has betas to cycle."""
    if isinstance(optimizer, torch.optim.Optimizer) or not hasattr(optimizer, "optimizer"):
        return optimizer
    return optimizer.optimizer


class Schedule:
    """What every DeepSpeed schedule does the same way: ``step`` moves t on by one (or to the
    value given) and writes ``get_lr()`` into the param groups; the state is t alone."""

    def get_last_lr(self) -> list:
        return self._last_lr

    def step(self, last_batch_iteration: int | None = None) -> None:
        self.last_batch_iteration = self.last_batch_iteration + 1 if last_batch_iteration is None \
            else last_batch_iteration
        self._last_lr = update_lr(self.optimizer.param_groups, self.get_lr())

    def state_dict(self) -> dict:
        return {"last_batch_iteration": self.last_batch_iteration}

    def load_state_dict(self, state: dict) -> None:
        self.last_batch_iteration = state["last_batch_iteration"]


class LRRangeTest(Schedule):
    """lr = min_lr * (1 + step_rate * interval), interval = (t + 1) / step_size, floored to whole
    steps with ``staircase``. Linear growth without end: the run is meant to be stopped."""

    def __init__(self, optimizer, lr_range_test_min_lr: float | list = 1e-3, lr_range_test_step_size: int = 2000,
                 lr_range_test_step_rate: float = 1.0, lr_range_test_staircase: bool = False,
                 last_batch_iteration: int = -1):
        self.optimizer = torch_optimizer(optimizer)
        self.min_lr = per_group(self.optimizer, lr_range_test_min_lr, "lr_range_test_min_lr")
        if not isinstance(lr_range_test_step_size, int) or lr_range_test_step_size <= 0:
            raise ValueError(f"lr_range_test_step_size must be a positive integer, got {lr_range_test_step_size}")
        self.step_size = lr_range_test_step_size
        self.step_rate = lr_range_test_step_rate
        self.staircase = lr_range_test_staircase
        self.last_batch_iteration = last_batch_iteration
        if last_batch_iteration == -1:   # t + 1 = 0: the first step runs at min_lr
            self._last_lr = update_lr(self.optimizer.param_groups, self.min_lr)

    def _interval(self) -> float:
        interval = (self.last_batch_iteration + 1) / self.step_size
        return math.floor(interval) if self.staircase else interval

    def get_lr(self) -> list:
        increase = 1 + self.step_rate * self._interval()
        return [low * increase for low in self.min_lr]

    def step(self, batch_iteration: int | None = None) -> None:   # (DeepSpeed's keyword here)
        super().step(batch_iteration)


class OneCycle(Schedule):
    """One triangle of ``total_size = first + second`` steps, then a decay phase.

    In the cycle, x is the position in it as a fraction (0 at the start, 1 at the end) and the
    scale rises x / ratio up to the peak at ratio = first / total, then falls back to 0:

        lr  = min_lr + (max_lr - min_lr) * scale       mom = max_mom - (max_mom - min_mom) * scale

    A stair count > 0 holds the scale flat on that many stairs per half. After the cycle, with a
    ``decay_step_size`` and a rate, lr = min_lr / (1 + decay_lr_rate * n / decay_step_size) and
    mom = max_mom * (1 + decay_mom_rate * n / decay_step_size), n counting from 1; else both stay
    at min_lr and max_mom. Only beta1 is cycled: DeepSpeed sets beta2 to 0.99 whatever it was.
    """

    def __init__(self, optimizer, cycle_min_lr, cycle_max_lr, decay_lr_rate: float = 0.0,
                 cycle_first_step_size: int = 2000, cycle_second_step_size: int | None = None,
                 cycle_first_stair_count: int = 0, cycle_second_stair_count: int | None = None,
                 decay_step_size: int = 0, cycle_momentum: bool = True, cycle_min_mom=0.8, cycle_max_mom=0.9,
                 decay_mom_rate: float = 0.0, last_batch_iteration: int = -1):
        self.optimizer = torch_optimizer(optimizer)
        first = float(cycle_first_step_size)
        second = float(cycle_second_step_size) if cycle_second_step_size is not None else first
        if first <= 0:   # the rising half divides by its length
            raise ValueError(f"cycle_first_step_size must be positive, got {first}")
        if second < 0:
            raise ValueError(f"cycle_second_step_size must be non-negative, got {second}")
        self.first_step_size, self.second_step_size = first, second
        self.total_size = first + second
        self.step_ratio = first / self.total_size
        self.first_stair_count = cycle_first_stair_count
        self.second_stair_count = cycle_first_stair_count if cycle_second_stair_count is None \
            else cycle_second_stair_count
        self.decay_step_size = decay_step_size
        # No decay without a step size, and none at a zero rate (each part tested on its own).
        no_steps = math.isclose(decay_step_size, 0)
        self.min_lrs = per_group(self.optimizer, cycle_min_lr, "cycle_min_lr")
        self.max_lrs = per_group(self.optimizer, cycle_max_lr, "cycle_max_lr")
        if last_batch_iteration == -1:
            update_lr(self.optimizer.param_groups, self.min_lrs)
        self.decay_lr_rate = decay_lr_rate
        self.skip_lr_decay = no_steps or math.isclose(decay_lr_rate, 0)
        self.skip_mom_decay = no_steps
        self.cycle_momentum = cycle_momentum and "betas" in getattr(self.optimizer, "defaults", {})
        if self.cycle_momentum:   # (DeepSpeed warns and goes on without it for an optimizer without betas)
            self.decay_mom_rate = decay_mom_rate
            self.min_moms = [(mom, 0.99) for mom in per_group(self.optimizer, cycle_min_mom, "cycle_min_mom")]
            self.max_moms = [(mom, 0.99) for mom in per_group(self.optimizer, cycle_max_mom, "cycle_max_mom")]
            if last_batch_iteration == -1:
                for group, betas in zip(self.optimizer.param_groups, self.min_moms):
                    group["betas"] = betas
            self.skip_mom_decay = self.skip_mom_decay or math.isclose(decay_mom_rate, 0)
        self.last_batch_iteration = last_batch_iteration

    def _get_scale_factor(self) -> float:
        batch = self.last_batch_iteration + 1
        cycle = math.floor(1 + batch / self.total_size)
        x = 1.0 + batch / self.total_size - cycle
        if x <= self.step_ratio:
            scale, stairs = x / self.step_ratio, self.first_stair_count
        else:
            scale, stairs = (x - 1) / (self.step_ratio - 1), self.second_stair_count
        if stairs > 0:
            # Counted from the whole batch offset, not from the float scale, which can land a
            # hair under a stair's edge and floor a whole stair lower (DeepSpeed's reasoning too).
            at = batch % self.total_size
            position = at * stairs / self.first_step_size if at <= self.first_step_size \
                else (self.total_size - at) * stairs / self.second_step_size
            scale = math.floor(position) / stairs
        return scale

    def _decay_interval(self) -> float:
        # (n / size) first, then the rate: DeepSpeed's order, so the floats round alike.
        return (self.last_batch_iteration - self.total_size + 1) / self.decay_step_size

    def get_lr(self) -> list:
        if self.last_batch_iteration < self.total_size:
            scale = self._get_scale_factor()
            return [low + (high - low) * scale for low, high in zip(self.min_lrs, self.max_lrs)]
        if self.skip_lr_decay:
            return self.min_lrs
        factor = 1 + self.decay_lr_rate * self._decay_interval()
        return [low / factor for low in self.min_lrs]

    def get_mom(self) -> list | None:
        if not self.cycle_momentum:
            return None
        if self.last_batch_iteration < self.total_size:
            scale = self._get_scale_factor()
            return [(high[0] - (high[0] - low[0]) * scale, low[1]) for low, high in zip(self.min_moms, self.max_moms)]
        if self.skip_mom_decay:
            return self.max_moms
        factor = 1 + self.decay_mom_rate * self._decay_interval()
        return [(beta1 * factor, beta2) for beta1, beta2 in self.max_moms]

    def step(self, batch_iteration: int | None = None) -> None:
        super().step(batch_iteration)
        if self.cycle_momentum:
            for group, betas in zip(self.optimizer.param_groups, self.get_mom()):
                group["betas"] = betas
