"""Count what autograd keeps for the backward pass: the activations a layout must hold.

The accountant (training/theoretical_activations.py) predicts these bytes from a formula; this
measures them, so the two can be compared. Autograd hands every tensor it saves to a *pack
hook* (``torch.autograd.graph.saved_tensors_hooks``); counting the hook's tensors by their
storage counts each buffer once, however many views of it are saved (q, k and v are views of
one QKV output; a dropout mask and its input are separate storages).

Weights are saved too (a linear keeps its weight for the input's gradient), but they are
parameters, not activations: pass them as ``exclude``. A parameter is recognised by its
storage, or (ZeRO-3, where the weight is gathered into fresh memory each forward) by being the
parameter object itself or a view of it.
"""

from __future__ import annotations

from typing import Iterable

import torch


class SavedTensors:
    """``with SavedTensors(exclude=model.parameters()) as saved: loss = model(x)`` then
    ``saved.nbytes`` (each storage once) and ``saved.shapes`` (every saved tensor, in order).
    The same object may be entered again: what later blocks save adds to the count."""

    def __init__(self, exclude: Iterable[torch.Tensor] = ()):
        exclude = list(exclude)
        self._excluded_ids = {id(t) for t in exclude}
        self._excluded_storages = {t.untyped_storage().data_ptr() for t in exclude}
        self.storages: dict[int, int] = {}   # storage address -> bytes
        self.shapes: list[list[int]] = []
        self._hooks: list = []

    def _is_weight(self, tensor: torch.Tensor) -> bool:
        return (id(tensor) in self._excluded_ids or id(tensor._base) in self._excluded_ids
                or tensor.untyped_storage().data_ptr() in self._excluded_storages)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if not self._is_weight(tensor):
            storage = tensor.untyped_storage()
            self.storages[storage.data_ptr()] = storage.nbytes()
            self.shapes.append(list(tensor.shape))
        return tensor

    @property
    def nbytes(self) -> int:
        return sum(self.storages.values())

    def __enter__(self) -> "SavedTensors":
        hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda tensor: tensor)
        hooks.__enter__()
        self._hooks.append(hooks)
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.pop().__exit__(*exc)
