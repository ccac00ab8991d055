"""What one rank says about its piece of a checkpoint: ShardedTensor, ShardedObject, and the
ShardedTensorFactory for weights stored in another shape than they are used in.

A legacy checkpoint is a file per (tp, pp) rank, so only the layout that wrote it can read it.
A *sharded* state dict instead describes every local tensor by its place in the global one:

    key            "decoder.layers.self_attention.linear_qkv.weight"   (one name at any layout)
    global_shape   (num_layers, 3h, h)                                 the whole tensor
    global_offset  (layer, tp_rank * 3h/tp, 0)                          where my piece starts
    replica_id     (0, 0, dp_rank)                                     0 everywhere: I write it

The checkpoint then holds global tensors cut into chunks, and any other layout reads the
pieces its own ShardedTensors cover, wherever they came from: resharding is a read, not a
conversion step.

``replica_id`` settles who writes a piece that several ranks hold (every data-parallel rank
holds the same weights; every tensor-parallel rank the same layernorm): the main replica,
the one whose id is all zeros, writes; the others only read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import torch

ReplicaId = int | tuple[int, ...]


class CheckpointingException(ValueError):
    """A sharded state dict or checkpoint that cannot be saved or loaded; says why."""


def is_main_replica(replica_id: ReplicaId) -> bool:
    """The one copy that is written: replica id 0, or a tuple of zeros."""
    return replica_id == 0 if isinstance(replica_id, int) else all(r == 0 for r in replica_id)


@dataclass
class ShardedTensor:
    """A local tensor and its place in the global tensor ``key``.

    ``prepend_axis_num`` axes of size 1 are put in front of the local data: that is how the
    layers of a stage become slices of one (num_layers, ...) tensor, each at its global layer
    index (Megatron stores a homogeneous stack of layers this way).
    ``allow_shape_mismatch``: the global shape may differ between save and load (the padded
    vocabulary of the embedding grows with the tensor-parallel size); the overlap is read and
    the rest left zero.
    """
    key: str
    data: torch.Tensor | None = field(repr=False)
    dtype: torch.dtype
    local_shape: tuple[int, ...]
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]
    axis_fragmentations: tuple[int, ...] | None
    replica_id: ReplicaId = 0
    prepend_axis_num: int = 0
    allow_shape_mismatch: bool = False

    def __post_init__(self):
        if self.data is not None and tuple(self.data.shape) != self.local_shape:
            raise CheckpointingException(f"{self.key}: data of shape {tuple(self.data.shape)}, "
                                         f"local_shape says {self.local_shape}")
        if len(self.global_shape) != len(self.global_offset) or \
                len(self.local_shape) + self.prepend_axis_num != len(self.global_shape):
            raise CheckpointingException(f"{self.key}: global shape {self.global_shape}, offset "
                                         f"{self.global_offset} and local shape {self.local_shape} "
                                         f"(+{self.prepend_axis_num} prepended axes) disagree")

    @classmethod
    def from_rank_offsets(cls, key: str, data: torch.Tensor, *rank_offsets: tuple[int, int, int],
                          replica_id: ReplicaId = 0, prepend_axis_num: int = 0, **kwargs) -> "ShardedTensor":
        """Place ``data`` by ranks rather than elements: each (axis, rank, count) says that the
        global tensor is cut in ``count`` equal pieces along ``axis`` and this is piece ``rank``."""
        ndim = data.ndim + prepend_axis_num
        shape = [1] * prepend_axis_num + list(data.shape)
        global_shape, offset, fragments = list(shape), [0] * ndim, [1] * ndim
        for axis, rank, count in rank_offsets:
            if not 0 <= rank < count or not 0 <= axis < ndim:
                raise CheckpointingException(f"{key}: rank offset {(axis, rank, count)} is out of range")
            global_shape[axis], offset[axis], fragments[axis] = count * shape[axis], rank * shape[axis], count
        return cls(key, data, data.dtype, tuple(data.shape), tuple(global_shape), tuple(offset),
                   tuple(fragments), replica_id, prepend_axis_num, **kwargs)


@dataclass
class ShardedObject:
    """Any picklable value as one cell of a grid of objects (``global_shape`` cells, mine at
    ``global_offset``). It cannot be resharded: a loader must ask for cells that were saved."""
    key: str
    data: Any
    global_shape: tuple[int, ...]
    global_offset: tuple[int, ...]
    replica_id: ReplicaId = 0

    @property
    def unique_key(self) -> str:
        """Megatron's name for one cell: ``key/shard_<offset>_<shape>``."""
        return (f"{self.key}/shard_{'.'.join(map(str, self.global_offset))}_"
                f"{'.'.join(map(str, self.global_shape))}")


@dataclass
class ShardedTensorFactory:
    """A tensor that is saved as something else: ``build_fn(key, data, replica_id)`` gives the
    ShardedTensors to save (or to load into), ``merge_fn(loaded)`` turns what was loaded back
    into the local tensor. The same factory serves the optimizer's moments, which have the
    parameter's shape and so need the same cut."""
    key: str
    data: torch.Tensor
    build_fn: Callable[[str, torch.Tensor, ReplicaId], Any]
    merge_fn: Callable[[Any], torch.Tensor]
    replica_id: ReplicaId = 0

    def build(self):
        return self.build_fn(self.key, self.data, self.replica_id)


def map_leaves(fn: Callable, tree):
    """A copy of a nested dict/list with ``fn`` applied to every leaf."""
    if isinstance(tree, dict):
        return {k: map_leaves(fn, v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [map_leaves(fn, v) for v in tree]
    return fn(tree)


def leaves(tree):
    """Every leaf of a nested dict/list, in order."""
    if isinstance(tree, dict):
        for v in tree.values():
            yield from leaves(v)
    elif isinstance(tree, list):
        for v in tree:
            yield from leaves(v)
    else:
        yield tree


def apply_factories(sharded_state_dict):
    """Each factory replaced by what its build_fn makes (a copy; the input is not changed)."""
    return map_leaves(lambda x: x.build() if isinstance(x, ShardedTensorFactory) else x, sharded_state_dict)


def apply_factory_merges(loaded, sharded_state_dict):
    """The inverse: where the sharded state dict had a factory, merge what was loaded there."""
    if isinstance(sharded_state_dict, ShardedTensorFactory):
        return sharded_state_dict.merge_fn(loaded)
    if isinstance(sharded_state_dict, dict):
        return {k: apply_factory_merges(loaded[k], v) for k, v in sharded_state_dict.items()}
    if isinstance(sharded_state_dict, list):
        return [apply_factory_merges(a, b) for a, b in zip(loaded, sharded_state_dict)]
    return loaded
