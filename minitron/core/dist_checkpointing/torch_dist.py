"""The bridge to PyTorch's own distributed checkpoint (DCP, ``torch.distributed.checkpoint``).

DCP already does the hard part: every rank says which chunks of which global tensors it holds,
rank 0 merges those plans into one ``.metadata`` file (each chunk's offset, size and the file
and byte range it landed in), and every rank writes its chunks to a file of its own,
``__<rank>_0.distcp``. On load every rank says which chunks it *wants*, and DCP reads the
overlapping byte ranges of whichever files hold them: the resharding.

What DCP needs from a value is the ``_Checkpointable`` protocol (torch/distributed/_checkpointable.py),
three methods: the chunks to write, the chunks to read into, the tensor behind one chunk. A
Megatron ShardedTensor is exactly one chunk; a rank may hold several chunks of one key (the
[gate | up] halves of SwiGLU's fc1), so one ``LocalChunks`` per key carries them all.
"""

from __future__ import annotations

import io

import torch
from torch.distributed.checkpoint.default_planner import DefaultLoadPlanner
from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
from torch.distributed.checkpoint.planner import TensorWriteData, WriteItem, WriteItemType


class LocalChunks(torch.Tensor):
    """This rank's chunks of one global tensor: [(offset, data), ...], data shaped as the chunk.

    A tensor subclass only so that DCP treats it as a tensor (its size is the global shape);
    it has no storage of its own and refuses every operation."""

    @staticmethod
    def __new__(cls, global_shape, dtype, chunks):
        return torch.Tensor._make_wrapper_subclass(cls, torch.Size(global_shape), dtype=dtype)

    def __init__(self, global_shape, dtype, chunks):
        self.chunks = [(torch.Size(offset), data) for offset, data in chunks]

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise NotImplementedError(f"LocalChunks is a checkpoint's description, not a tensor to compute with ({func})")

    def __create_write_items__(self, fqn: str, obj) -> list[WriteItem]:
        return [WriteItem(index=MetadataIndex(fqn, offset, i), type=WriteItemType.SHARD,
                          tensor_data=TensorWriteData(
                              chunk=ChunkStorageMetadata(offsets=offset, sizes=data.shape),
                              properties=TensorProperties.create_from_tensor(data), size=self.size()))
                for i, (offset, data) in enumerate(self.chunks)]

    def __create_chunk_list__(self) -> list[ChunkStorageMetadata]:
        return [ChunkStorageMetadata(offsets=offset, sizes=data.shape) for offset, data in self.chunks]

    def __get_tensor_shard__(self, index: MetadataIndex) -> torch.Tensor:
        for offset, data in self.chunks:
            if offset == index.offset:
                return data
        raise ValueError(f"{index.fqn}: no local chunk at offset {tuple(index.offset)}")


class WeightsOnlyLoadPlanner(DefaultLoadPlanner):
    """DCP's default planner unpickles stored objects with ``weights_only=False``, which runs
    whatever code a planted file names. minitron loads checkpoints as data only (as the legacy
    format does), so objects go through the weights-only unpickler: tensors, numbers,
    strings, containers."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.objects: dict = {}   # key -> each stored object this rank read

    def load_bytes(self, read_item, value: io.BytesIO) -> None:
        # Kept here: the planner works on its own flattened copy of the state dict, not ours.
        # map_location: an object written on a GPU rank (its tensors tagged cuda) loads on any rank.
        self.objects[read_item.dest_index.fqn] = torch.load(value, map_location="cpu", weights_only=True)

    def create_local_plan(self):
        """DCP's plan, remembered: which stored chunks this rank reads (``bytes_read``)."""
        self.plan = super().create_local_plan()
        return self.plan

    def bytes_read(self) -> dict[str, int]:
        """file -> bytes this rank read from it. DCP reads each stored chunk it needs whole and
        cuts the overlap out in memory, so a chunk counts once, with its full length."""
        chunks = {(item.storage_index.fqn, tuple(item.storage_index.offset or ()))
                  for item in self.plan.items}
        read: dict[str, int] = {}
        for index, info in self.metadata.storage_data.items():
            if (index.fqn, tuple(index.offset or ())) in chunks:
                read[info.relative_path] = read.get(info.relative_path, 0) + info.length
        return read
