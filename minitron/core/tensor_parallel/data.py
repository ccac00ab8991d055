"""broadcast_data: one rank of each tensor-parallel group reads the batch, the others receive it.

All ranks of a TP group work on the same micro-batch (they split the model, not the data).
Reading it once and broadcasting saves the data loader on p-1 of every p ranks. Two
broadcasts: first the shapes (the receivers must allocate), then all tensors flattened into
one buffer (one collective instead of one per key).
"""

from __future__ import annotations

import math

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state
from minitron.trace import traced

_MAX_DATA_DIM = 5  # a tensor of up to 5 dims: each key gets 5 slots in the shapes message


def _broadcast_sizes(keys, data, group, src: int):
    sizes = torch.zeros(len(keys) * _MAX_DATA_DIM, dtype=torch.long)  # host: filled from Python shapes
    if group.rank() == 0:
        for k, key in enumerate(keys):
            shape = data[key].shape
            if not 0 < len(shape) < _MAX_DATA_DIM:
                raise ValueError(f"broadcast_data: {key!r} has {len(shape)} dims; use 1 to {_MAX_DATA_DIM - 1}")
            sizes[k * _MAX_DATA_DIM:k * _MAX_DATA_DIM + len(shape)] = torch.tensor(shape)  # host: as above
    sizes = sizes.to(get_accelerator().current_device_name())
    torch.distributed.broadcast(sizes, src, group=group)
    sizes = sizes.tolist()   # the one copy back: the receivers allocate from these
    # A zero ends each key's shape (a real dimension of size 0 would carry no data anyway).
    return {key: [s for s in sizes[k * _MAX_DATA_DIM:(k + 1) * _MAX_DATA_DIM] if s > 0]
            for k, key in enumerate(keys)}


@traced(args=lambda keys, data, datatype: {"keys": list(keys), "dtype": str(datatype)})
def broadcast_data(keys, data, datatype):
    """Send ``data[key]`` for each key from TP rank 0 to its group; return the dict on every rank.

    ``data`` matters only on TP rank 0 (the others may pass None); every tensor must have
    ``datatype``.
    """
    group = parallel_state.get_tensor_model_parallel_group()
    src = parallel_state.get_tensor_model_parallel_src_rank()
    if group.rank() == 0:
        for key in keys:
            if data[key].dtype != datatype:
                raise TypeError(f"broadcast_data: {key!r} is {data[key].dtype}, expected {datatype}")
    shapes = _broadcast_sizes(keys, data, group, src)
    numels = {key: math.prod(shape) for key, shape in shapes.items()}
    if group.rank() == 0:
        flat = torch.cat([data[key].contiguous().view(-1) for key in keys]).to(get_accelerator().current_device_name())
    else:
        flat = torch.empty(sum(numels.values()), dtype=datatype, device=get_accelerator().current_device_name())
    torch.distributed.broadcast(flat, src, group=group)
    output, offset = {}, 0
    for key in keys:
        output[key] = flat.narrow(0, offset, numels[key]).view(shapes[key])
        offset += numels[key]
    return output
