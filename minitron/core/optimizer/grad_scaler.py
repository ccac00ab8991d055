"""Loss scalers: the number the loss is multiplied by before backward, and how it moves.

fp16 has 5 exponent bits: its smallest normal value is about 6e-5, and gradients of a large
model are often far smaller. Multiplying the loss by S multiplies every gradient by S (the
chain rule is linear), lifting them into fp16's range; the optimizer divides by S again, in
fp32, before using them. Too large an S overflows to Inf, so the scale has to be found.

DynamicGradScaler finds it by trial, with Megatron's rules:

* a step whose gradients hold Inf/NaN is skipped, the growth count restarts, and the
  hysteresis count drops by one; when it reaches zero the scale is multiplied by
  ``backoff_factor`` (0.5), never going below ``min_scale``. The count is *not* refilled by
  a back-off: once it is exhausted, every further overflow halves the scale again;
* after ``growth_interval`` clean steps in a row the scale is multiplied by ``growth_factor``
  (2.0) and the hysteresis count is refilled.

Hysteresis exists because a single overflow is often a fluke of one batch: halving at once
would throw away precision for the thousand steps it takes to grow back.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from minitron.accelerator import get_accelerator


def _device() -> str:
    return get_accelerator().current_device_name()


class MegatronGradScaler(ABC):
    def __init__(self, initial_scale: float):
        if not initial_scale > 0.0:
            raise ValueError(f"the initial loss scale must be positive, got {initial_scale}")
        # A one-element tensor on the rank's device, as in Megatron: the loss is multiplied by
        # it, and the scale grown or backed off, without a copy or a sync.
        self._scale = torch.tensor([float(initial_scale)], dtype=torch.float32, device=_device())

    @property
    def scale(self) -> torch.Tensor:
        return self._scale

    @property
    def inv_scale(self) -> torch.Tensor:
        # Take the reciprocal in float64: 1/S for a power of two is exact either way, but a
        # user-chosen constant scale need not be one.
        return self._scale.double().reciprocal().float()

    @abstractmethod
    def update(self, found_inf: bool) -> None: ...

    @abstractmethod
    def state_dict(self) -> dict: ...

    @abstractmethod
    def load_state_dict(self, state_dict: dict) -> None: ...


class ConstantGradScaler(MegatronGradScaler):
    """--loss-scale S: always S, overflow or not (overflowing steps are still skipped)."""

    def update(self, found_inf: bool) -> None:
        pass

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state_dict: dict) -> None:
        pass


# --8<-- [start:dynamic]
class DynamicGradScaler(MegatronGradScaler):
    def __init__(self, initial_scale: float, min_scale: float, growth_factor: float,
                 backoff_factor: float, growth_interval: int, hysteresis: int):
        super().__init__(initial_scale)
        checks = [(0.0 < min_scale <= initial_scale, "0 < min_scale <= initial_scale"),
                  (growth_factor > 1.0, "growth_factor > 1"),
                  (0.0 < backoff_factor < 1.0, "0 < backoff_factor < 1"),
                  (growth_interval > 0, "growth_interval > 0"), (hysteresis > 0, "hysteresis > 0")]
        for ok, rule in checks:
            if not ok:
                raise ValueError(f"DynamicGradScaler needs {rule}")
        self.min_scale = torch.tensor([float(min_scale)], device=_device())
        self.growth_factor = torch.tensor([float(growth_factor)], device=_device())
        self.backoff_factor = torch.tensor([float(backoff_factor)], device=_device())
        self.growth_interval = growth_interval
        self.hysteresis = hysteresis
        self._growth_tracker = 0                 # clean steps in a row
        self._hysteresis_tracker = hysteresis    # overflows still tolerated before backing off

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self._growth_tracker = 0
            self._hysteresis_tracker -= 1
            if self._hysteresis_tracker <= 0:
                self._scale = torch.max(self._scale * self.backoff_factor, self.min_scale)
        else:
            self._growth_tracker += 1
            if self._growth_tracker == self.growth_interval:
                self._growth_tracker = 0
                self._hysteresis_tracker = self.hysteresis
                self._scale = self._scale * self.growth_factor
# --8<-- [end:dynamic]

    def state_dict(self) -> dict:
        return {"scale": self._scale, "growth_tracker": self._growth_tracker,
                "hysteresis_tracker": self._hysteresis_tracker}

    def load_state_dict(self, state_dict: dict) -> None:
        self._scale = state_dict["scale"].detach().clone().float().to(_device())
        self._growth_tracker = state_dict["growth_tracker"]
        self._hysteresis_tracker = state_dict["hysteresis_tracker"]
