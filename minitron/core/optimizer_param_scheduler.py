"""OptimizerParamScheduler: the learning rate and weight decay as functions of progress.

Progress is counted in whatever unit ``step(increment)`` is given. Megatron's training loop
calls ``step(increment=num_microbatches * micro_batch_size * data_parallel_size)``, the
global batch size, so ``num_steps`` counts *samples*, and the warm-up and decay lengths are
given in samples too (--lr-warmup-iters x global batch, or --lr-warmup-samples). Counting
samples keeps the schedule right when the batch size ramps up during training.

    lr(n) = init_lr + (max_lr - init_lr) * n / warmup          n <= warmup (linear warm-up)
          = min_lr + (max_lr - min_lr) * coeff(ratio)          warmup < n <= decay_steps
          = min_lr                                             n > decay_steps
    ratio = (n - warmup) / (decay_steps - warmup)
    coeff: linear 1 - ratio; cosine (1 + cos(pi * ratio)) / 2; constant: lr stays max_lr;
    inverse-square-root: max_lr * sqrt(warmup / n), floored at min_lr;
    WSD (warmup-stable-decay): 1 until the last ``wsd_decay_steps`` before decay_steps, then
    the annealing coefficient of ``lr_wsd_decay_style`` over r = the share of them done:
    linear 1 - r; cosine (1 + cos(pi r)) / 2; exponential 2 * 0.5**r - 1; minus_sqrt 1 - sqrt(r).

Each param group may carry its own ``max_lr`` and ``min_lr`` (Megatron-Core 0.19's param-group
overrides: --decoupled-lr gives the embedding and output layer theirs), ``start_wd`` / ``end_wd``,
and ``wd_mult`` (0 for biases and norms). A group's ``lr_mult`` is no longer read: Megatron 0.19
keeps the key for old checkpoints but schedules every group by its max_lr and min_lr.
"""

from __future__ import annotations

import math

from minitron.trace import traced

LR_DECAY_STYLES = ("constant", "linear", "cosine", "inverse-square-root", "WSD")
LR_WSD_DECAY_STYLES = ("exponential", "linear", "cosine", "minus_sqrt")
WD_INCR_STYLES = ("constant", "linear", "cosine")


def get_canonical_lr_for_logging(param_groups: list[dict]) -> float | None:
    """The lr to log: the first group on the default schedule (not --decoupled-lr's)."""
    return next((group.get("lr") for group in param_groups if group.get("default_config", True)), None)


class OptimizerParamScheduler:
    def __init__(self, optimizer, init_lr: float, max_lr: float, min_lr: float, lr_warmup_steps: int,
                 lr_decay_steps: int, lr_decay_style: str, start_wd: float, end_wd: float,
                 wd_incr_steps: int, wd_incr_style: str, use_checkpoint_opt_param_scheduler: bool = True,
                 override_opt_param_scheduler: bool = False, wsd_decay_steps: int | None = None,
                 lr_wsd_decay_style: str | None = None):
        self.optimizer = optimizer
        self.init_lr, self.max_lr, self.min_lr = init_lr, float(max_lr), min_lr
        self.lr_warmup_steps, self.lr_decay_steps = lr_warmup_steps, lr_decay_steps
        self.lr_decay_style = lr_decay_style
        self.wsd_decay_steps, self.lr_wsd_decay_style = wsd_decay_steps, lr_wsd_decay_style
        self.start_wd, self.end_wd = start_wd, end_wd
        self.wd_incr_steps, self.wd_incr_style = wd_incr_steps, wd_incr_style
        self.use_checkpoint_opt_param_scheduler = use_checkpoint_opt_param_scheduler
        self.override_opt_param_scheduler = override_opt_param_scheduler
        self._validate()
        self.num_steps = 0
        self.step(0)   # write the starting lr and wd into the param groups

    def _validate(self) -> None:
        rules = [
            (0.0 <= self.min_lr <= self.max_lr, f"0 <= min_lr ({self.min_lr}) <= max_lr ({self.max_lr})"),
            (self.init_lr <= self.max_lr, f"init_lr ({self.init_lr}) <= max_lr ({self.max_lr})"),
            (self.lr_decay_steps > 0, f"lr_decay_steps ({self.lr_decay_steps}) > 0"),
            (self.lr_warmup_steps < self.lr_decay_steps,
             f"lr_warmup_steps ({self.lr_warmup_steps}) < lr_decay_steps ({self.lr_decay_steps})"),
            (self.lr_decay_style in LR_DECAY_STYLES, f"lr_decay_style in {LR_DECAY_STYLES}"),
            (self.lr_decay_style != "WSD" or (self.wsd_decay_steps is not None
                                              and self.lr_wsd_decay_style in LR_WSD_DECAY_STYLES),
             f"wsd_decay_steps and lr_wsd_decay_style in {LR_WSD_DECAY_STYLES} when lr_decay_style is 'WSD'"),
            (0.0 <= self.start_wd <= self.end_wd, f"0 <= start_wd ({self.start_wd}) <= end_wd ({self.end_wd})"),
            (self.wd_incr_style in WD_INCR_STYLES, f"wd_incr_style in {WD_INCR_STYLES}"),
            (self.wd_incr_style != "constant" or self.start_wd == self.end_wd,
             "start_wd == end_wd when wd_incr_style is 'constant'"),
            (not (self.override_opt_param_scheduler and self.use_checkpoint_opt_param_scheduler),
             "not both override_opt_param_scheduler and use_checkpoint_opt_param_scheduler"),
        ]
        for ok, rule in rules:
            if not ok:
                raise ValueError(f"OptimizerParamScheduler needs {rule}")

    def get_wd(self, param_group: dict | None = None) -> float:
        group = param_group or {}
        start_wd, end_wd = group.get("start_wd", self.start_wd), group.get("end_wd", self.end_wd)
        if self.num_steps > self.wd_incr_steps or self.wd_incr_style == "constant":
            return end_wd
        ratio = self.num_steps / self.wd_incr_steps
        coeff = ratio if self.wd_incr_style == "linear" else 0.5 * (math.cos(math.pi * (1 - ratio)) + 1.0)
        return start_wd + coeff * (end_wd - start_wd)

    def get_lr(self, param_group: dict | None = None) -> float:
        group = param_group or {}
        max_lr = group.get("max_lr", self.max_lr)
        min_lr = group.get("min_lr", self.min_lr)
        n = self.num_steps
        if self.lr_warmup_steps > 0 and n <= self.lr_warmup_steps:
            return self.init_lr + (max_lr - self.init_lr) * n / self.lr_warmup_steps
        if self.lr_decay_style == "constant":
            return max_lr
        if n > self.lr_decay_steps:
            return min_lr
        if self.lr_decay_style == "inverse-square-root":
            warmup = max(self.lr_warmup_steps, 1)
            return max(min_lr, max_lr * math.sqrt(warmup) / math.sqrt(max(n, 1)))
        ratio = (n - self.lr_warmup_steps) / (self.lr_decay_steps - self.lr_warmup_steps)
        if self.lr_decay_style == "linear":
            coeff = 1.0 - ratio
        elif self.lr_decay_style == "cosine":  # half a cosine period, from 1 after warm-up to 0 at decay end
            coeff = 0.5 * (math.cos(math.pi * ratio) + 1.0)
        else:
            coeff = self._wsd_coeff(n)
        return min_lr + coeff * (max_lr - min_lr)

    def _wsd_coeff(self, n: float) -> float:
        """Warmup-stable-decay: hold the peak (a run can stop or branch anywhere in the stable
        phase), then anneal over the last wsd_decay_steps only."""
        anneal_start = self.lr_decay_steps - self.wsd_decay_steps
        if n <= anneal_start:
            return 1.0
        r = (n - anneal_start) / self.wsd_decay_steps   # 0 -> 1 over the anneal; each coeff goes 1 -> 0
        if self.lr_wsd_decay_style == "linear":
            return 1.0 - r
        if self.lr_wsd_decay_style == "cosine":
            return 0.5 * (math.cos(math.pi * r) + 1.0)
        if self.lr_wsd_decay_style == "exponential":   # halves the distance to 0 ... shifted to end at 0
            return 2.0 * 0.5 ** r - 1.0
        return 1.0 - math.sqrt(r)                       # minus_sqrt: falls fastest at the start

    @traced(args=lambda self, increment: {"increment": increment, "num_steps": self.num_steps + increment})
    def step(self, increment: int) -> None:
        """Advance by ``increment`` (samples, in Megatron's loop) and set every group's lr and wd."""
        self.num_steps += increment
        for group in self.optimizer.param_groups:
            group["lr"] = self.get_lr(group)
            group["weight_decay"] = self.get_wd(group) * group.get("wd_mult", 1.0)

    def state_dict(self) -> dict:
        return {name: getattr(self, name) for name in (
            "max_lr", "lr_warmup_steps", "num_steps", "lr_decay_style", "lr_decay_steps", "min_lr",
            "start_wd", "end_wd", "wd_incr_style", "wd_incr_steps")}

    def _check_and_set(self, current, saved, name: str):
        """Resuming: the checkpoint's value wins, unless told to override (or to insist)."""
        if self.override_opt_param_scheduler:
            return current
        if not self.use_checkpoint_opt_param_scheduler and current != saved:
            raise ValueError(f"OptimizerParamScheduler: {name} is {current} now but {saved} in the "
                             "checkpoint; pass --override-opt-param-scheduler or "
                             "--use-checkpoint-opt_param-scheduler")
        return saved

    def load_state_dict(self, state_dict: dict) -> None:
        for name in ("max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style",
                     "start_wd", "end_wd", "wd_incr_steps", "wd_incr_style"):
            setattr(self, name, self._check_and_set(getattr(self, name), state_dict[name], name))
        self.num_steps = 0
        self.step(increment=state_dict["num_steps"])
