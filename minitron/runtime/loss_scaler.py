"""DeepSpeed's loss scalers (``deepspeed/runtime/fp16/loss_scaler.py``): static and dynamic.

The idea is the one in ``minitron/core/optimizer/grad_scaler.py`` (Megatron's scaler): multiply
the loss by S before backward so fp16 gradients do not underflow, divide by S in fp32 before the
update, skip any step whose gradients hold Inf/NaN. DeepSpeed's rules for moving S agree with
Megatron's on the common path and differ in three places, which is why this is a second class
beside the first rather than the first one reused:

* **hysteresis** (``delayed_shift`` = h) agrees: the h-th overflow without a growth in between
  halves S, and every overflow after it halves again until a growth refills the counter.
  DeepSpeed tests the counter (``== 1``) before lowering it, Megatron lowers it before testing
  (``<= 0``); the sequences of scales come out the same.
* **consecutive_hysteresis** is DeepSpeed's alone: optionally, any clean step refills the
  counter at once, so only h overflows *in a row* halve S.
* **the floor**: Megatron clamps at ``min_scale`` for ever; DeepSpeed raises once an overflow
  happens *at* ``min_scale`` (``raise_error_at_min_scale``), since training there is hopeless.
* **growth**: Megatron multiplies S by 2 after every ``growth_interval`` clean steps in a row.
  DeepSpeed counts from the last overflow, leaving out the first clean step after it
  (``stable_interval``): the first growth comes after ``scale_window`` + 1 clean steps, the
  next ones every ``scale_window``. It is Megatron's counter started at -1 instead of 0 after
  each overflow (and at the start). Until 0.17.1 DeepSpeed grew after ``scale_window``, as
  Megatron does.
"""

from __future__ import annotations

import torch


class LossScaler:
    """A fixed scale (``fp16.loss_scale > 0``, or 1.0 for fp32/bf16): overflowing steps are
    still skipped, but the scale never moves."""

    dynamic = False

    def __init__(self, scale: float = 1.0):
        self.cur_scale = float(scale)

    @property
    def loss_scale(self) -> float:
        return self.cur_scale

    def update_scale(self, overflow: bool) -> None:
        pass

    def state_dict(self) -> dict:
        return {"cur_scale": self.cur_scale}

    def load_state_dict(self, state: dict) -> None:
        self.cur_scale = state["cur_scale"]


# --8<-- [start:update-scale]
class DynamicLossScaler(LossScaler):
    dynamic = True

    def __init__(self, init_scale: float = 2.0 ** 32, scale_factor: float = 2.0, scale_window: int = 1000,
                 min_scale: float = 1.0, delayed_shift: int = 1, consecutive_hysteresis: bool = False,
                 raise_error_at_min_scale: bool = True):
        super().__init__(init_scale)
        self.cur_iter = 0
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window
        self.min_scale = min_scale
        self.delayed_shift = delayed_shift
        self.cur_hysteresis = delayed_shift
        self.consecutive_hysteresis = consecutive_hysteresis
        self.raise_error_at_min_scale = raise_error_at_min_scale

    def update_scale(self, overflow: bool) -> None:
        if overflow:
            if self.delayed_shift == 1 or self.cur_hysteresis == 1:
                if self.cur_scale == self.min_scale and self.raise_error_at_min_scale:
                    raise FloatingPointError(f"the fp16 loss scale is already at its minimum {self.min_scale} and "
                                             "the gradients still overflow; lower the learning rate or use bf16")
                self.cur_scale = max(self.cur_scale / self.scale_factor, self.min_scale)
            else:
                self.cur_hysteresis -= 1     # tolerate this one: it may be a fluke of one batch
            self.last_overflow_iter = self.cur_iter
        else:
            if self.consecutive_hysteresis:
                self.cur_hysteresis = self.delayed_shift
            # Clean steps since the last overflow, not counting the first: growth waits for
            # scale_window + 1 of them, then comes every scale_window (DeepSpeed since 0.17.1).
            stable_interval = self.cur_iter - self.last_overflow_iter - 1
            if stable_interval > 0 and stable_interval % self.scale_window == 0:
                if not self.consecutive_hysteresis:
                    self.cur_hysteresis = self.delayed_shift
                self.cur_scale *= self.scale_factor
        self.cur_iter += 1
# --8<-- [end:update-scale]

    def state_dict(self) -> dict:
        return {key: getattr(self, key) for key in
                ("cur_scale", "cur_iter", "last_overflow_iter", "cur_hysteresis")}

    def load_state_dict(self, state: dict) -> None:
        for key, value in state.items():
            setattr(self, key, value)


def CreateLossScaler(dtype: torch.dtype, static_loss_scale: float, dynamic_scaling: bool,
                     dynamic_loss_args: dict | None) -> LossScaler:
    """DeepSpeed's factory: dynamic only for fp16 with ``loss_scale: 0``; otherwise a fixed
    scale, which for fp32 and bf16 is 1 (their exponent range needs no scaling)."""
    if dtype == torch.half and dynamic_scaling:
        return DynamicLossScaler(**(dynamic_loss_args or {}))
    return LossScaler(static_loss_scale if dtype == torch.half else 1.0)
