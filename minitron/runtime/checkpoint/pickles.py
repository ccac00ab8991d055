"""Reading a DeepSpeed-written checkpoint without DeepSpeed.

DeepSpeed pickles some of its own objects into its files: the loss scaler (``LossScaler``,
``DynamicLossScaler``), the stage (``ZeroStageEnum``, an int enum), fragment addresses for the
universal checkpoint. ``torch.load`` would import ``deepspeed`` to rebuild them. minitron never
imports DeepSpeed, so ``load_state`` hands torch an unpickler that turns every ``deepspeed.*``
class into a stand-in: an object that keeps the attributes it was pickled with (``vars(x)``
gives the scaler's ``cur_scale`` and the rest) and, for an enum, its value (``int(x)``).
"""

from __future__ import annotations

import pickle
from pathlib import Path

import torch


class DeepSpeedObject:
    """A DeepSpeed object read back without its class: its state, nothing else."""

    def __init__(self, *args):
        # An enum member is pickled as a call of its class on its value.
        if args:
            self.value = args[0]

    def __int__(self) -> int:
        return int(self.value)

    def __repr__(self) -> str:
        return f"<{type(self).__qualname__} {vars(self)}>"


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "deepspeed" or module.startswith("deepspeed."):
            # One stand-in class per DeepSpeed class, named after it, so a repr says what it was.
            return type(name, (DeepSpeedObject,), {"__module__": module})
        return super().find_class(module, name)


class _PickleModule:
    """The two names torch.load asks of its ``pickle_module``."""
    Unpickler = _Unpickler
    load = staticmethod(pickle.load)
    __name__ = "minitron.runtime.checkpoint.pickles"


def load_state(path: str | Path) -> dict:
    """A checkpoint file, on the CPU, with DeepSpeed's objects as stand-ins. The files hold
    Python objects (the config, counters), so torch's tensors-only loading does not apply."""
    return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_PickleModule)
