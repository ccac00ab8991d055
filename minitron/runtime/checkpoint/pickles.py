"""Reading and writing DeepSpeed's pickled objects without DeepSpeed.

DeepSpeed pickles some of its own objects into its files: the loss scaler (``LossScaler``,
``DynamicLossScaler``), the stage (``ZeroStageEnum``, an int enum), fragment addresses for the
universal checkpoint. ``torch.load`` would import ``deepspeed`` to rebuild them. minitron never
imports DeepSpeed, so ``load_state`` hands torch an unpickler that turns every ``deepspeed.*``
class into a stand-in: an object that keeps the attributes it was pickled with (``vars(x)``
gives the scaler's ``cur_scale`` and the rest) and, for an enum, its value (``int(x)``).

Writing is the mirror image. DeepSpeed's engine does not read the scaler's numbers out of the
file, it *adopts* the unpickled object as its scaler and calls ``scale_loss`` on it, so a dict
will not do: the file must name DeepSpeed's class. ``save_state`` pickles a stand-in made by
``deepspeed_object`` as that class: its name, then its attributes, exactly the bytes DeepSpeed's
own object gives. Python's pickler checks that a class it names can be imported and is the
same object; DeepSpeed is not importable here, so ``_Pickler`` writes those names itself.
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

    def __eq__(self, other) -> bool:
        # Each read makes its own stand-in class: equal when they name the same DeepSpeed class.
        return (isinstance(other, DeepSpeedObject) and _name(type(self)) == _name(type(other))
                and vars(self) == vars(other))

    __hash__ = None   # equal by attributes, which may change: not a dict key

    def __reduce_ex__(self, protocol):
        # Written again (ds_to_universal copies the stage on): an enum member as Python pickles
        # one, a call of its class on its value; any other object as attributes to set.
        if vars(self).keys() == {"value"}:
            return type(self), (self.value,)
        return super().__reduce_ex__(protocol)


def _name(cls: type) -> tuple[str, str]:
    return cls.__module__, cls.__qualname__


def _stand_in(module: str, name: str) -> type:
    """One stand-in class per DeepSpeed class, named after it, so a repr says what it was."""
    return type(name, (DeepSpeedObject,), {"__module__": module})


def deepspeed_object(qualified: str, state: dict) -> DeepSpeedObject:
    """An object that pickles as DeepSpeed's class ``qualified`` (``deepspeed.x.y.Class``)
    holding ``state`` as its attributes, in that order (``vars()`` of a real one)."""
    module, _, name = qualified.rpartition(".")
    obj = DeepSpeedObject.__new__(_stand_in(module, name))
    obj.__dict__.update(state)
    return obj


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str):
        if module == "deepspeed" or module.startswith("deepspeed."):
            return _stand_in(module, name)
        return super().find_class(module, name)


class _Pickler(pickle._Pickler):
    """Python's own pickler (the pure-Python one: the C one's class check cannot be overridden),
    told to name a stand-in's DeepSpeed class as it is, unchecked. An instance goes out as any
    plain object does at protocol 2: 'make an empty one of this class, set these attributes'."""

    def save_global(self, obj, name=None):
        if isinstance(obj, type) and issubclass(obj, DeepSpeedObject) and obj is not DeepSpeedObject:
            module, qualname = _name(obj)
            self.write(pickle.GLOBAL + f"{module}\n{qualname}\n".encode())
            self.memoize(obj)
            return
        super().save_global(obj, name)


class _PickleModule:
    """The names torch.load and torch.save ask of their ``pickle_module``."""
    Unpickler, Pickler = _Unpickler, _Pickler
    load = staticmethod(pickle.load)
    __name__ = "minitron.runtime.checkpoint.pickles"


def load_state(path: str | Path) -> dict:
    """A checkpoint file, on the CPU, with DeepSpeed's objects as stand-ins. The files hold
    Python objects (the config, counters), so torch's tensors-only loading does not apply."""
    return torch.load(path, map_location="cpu", weights_only=False, pickle_module=_PickleModule)


def save_state(value, path: str | Path) -> None:
    """``torch.save``, able to write the stand-ins (read back, or made by deepspeed_object) as
    the DeepSpeed objects they stand for."""
    torch.save(value, path, pickle_module=_PickleModule)
