"""Point to point between neighbouring stages (``deepspeed/runtime/pipe/p2p.py``): stages in,
world ranks out, through minitron's comm layer.

A send names a stage; the rank is the one at that stage with my data (and model) coordinates,
so each data-parallel replica's pipeline talks only within itself. The receiver must know the
shapes and dtypes before it can post a receive; the engine sends them once, before the first
activation (``send_tensor_meta``), and then reuses the buffers for every micro-batch, as
DeepSpeed does unless a model asks for dynamic shapes.
"""

from __future__ import annotations

import torch

from minitron import comm as dist   # as DeepSpeed's: from deepspeed import comm as dist
from minitron.accelerator import get_accelerator

_grid = None

# The dtypes a meta message can name, by position (DeepSpeed's ID_TO_DTYPE order).
ID_TO_DTYPE = [torch.float32, torch.float64, torch.complex64, torch.complex128, torch.float16, torch.bfloat16,
               torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64, torch.bool]
DTYPE_TO_ID = {dtype: i for i, dtype in enumerate(ID_TO_DTYPE)}


def init_process_groups(grid) -> None:
    """Remember the grid. (DeepSpeed made a two-rank group per neighbour pair for torch < 1.8,
    which had no send/recv; plain send and recv need none.)"""
    global _grid
    if grid.pipe_parallel_size <= 1:
        raise ValueError("there is no pipeline parallelism")
    _grid = grid


def _check_neighbours(src_stage: int, dest_stage: int) -> None:
    last = _grid.pipe_parallel_size - 1
    if abs(src_stage - dest_stage) != 1 and {src_stage, dest_stage} != {0, last}:
        raise ValueError(f"stage {src_stage} -> {dest_stage}: only neighbouring stages exchange tensors")


def send(tensor: torch.Tensor, dest_stage: int) -> None:
    _check_neighbours(_grid.get_stage_id(), dest_stage)
    dist.send(tensor, _grid.stage_to_global(stage_id=dest_stage))


def recv(tensor: torch.Tensor, src_stage: int) -> None:
    _check_neighbours(src_stage, _grid.get_stage_id())
    dist.recv(tensor, _grid.stage_to_global(stage_id=src_stage))


def send_tensor_meta(tensors: tuple, dest_stage: int) -> None:
    """How many tensors, then for each: dtype id, number of dims, the dims (longs). The header
    travels as the activations do, on the device: nccl moves nothing else."""
    header = [len(tensors)]
    for t in tensors:
        header += [DTYPE_TO_ID[t.dtype], t.dim(), *t.shape]
    device = tensors[0].device
    send(torch.tensor([len(header)], dtype=torch.long, device=device), dest_stage)
    send(torch.tensor(header, dtype=torch.long, device=device), dest_stage)


def recv_tensor_meta(src_stage: int) -> tuple:
    """Empty tensors of the announced shapes and dtypes, on this rank's device: the receive
    buffers. Reading the header waits for the device, once per run (the shapes do not change)."""
    device = get_accelerator().current_device_name()
    length = torch.zeros(1, dtype=torch.long, device=device)
    recv(length, src_stage)
    header = torch.zeros(int(length), dtype=torch.long, device=device)
    recv(header, src_stage)
    values, pos, buffers = header.tolist(), 1, []
    for _ in range(values[0]):
        dtype, ndim = ID_TO_DTYPE[values[pos]], values[pos + 1]
        buffers.append(torch.zeros(values[pos + 2:pos + 2 + ndim], dtype=dtype, device=device))
        pos += 2 + ndim
    return tuple(buffers)
