"""ZeRO-Infinity's optimizer swapper: DeepSpeed's ``PartitionedOptimizerSwapper``
(``runtime/swap_tensor/partitioned_optimizer_swapper.py``, ``optimizer_utils.py``), in plain
file I/O.

At stage 3 with ``offload_optimizer.device: nvme`` the fp32 master of each sub-group (a param
group's pieces, cut at about ``sub_group_size`` elements: zero/stage3.py) and the optimizer's
state tensors of it live in files between steps:

    {nvme_path}/zero_stage_3/optimizer/rank{R}/
        {first}_{last}.tensor.swp             the fp32 master (first/last: the ds_ids of the
                                              sub-group's first and last parameters)
        exp_avg-{first}_{last}.tensor.swp     each state tensor, named after its key
        exp_avg_sq-{first}_{last}.tensor.swp

Each file holds the tensor's bytes padded with zeros to a multiple of ``aio.intra_op_parallelism``
x 1 KiB (DeepSpeed's aligned I/O buffers), so its size says the alignment. A tensor under
max(1 MiB, ``aio.block_size``) is not swapped (``is_swappable_tensor``): it stays in host memory.
The step reads a group's files into host tensors (``swap_in_optimizer_state``), steps, writes
them back and drops the host copies (``swap_out_optimizer_state``). Before the first step the
optimizer has no moments, so only the master's file exists.

What DeepSpeed's swapper adds: pinned, aligned buffers from a pool of ``buffer_count`` (a step
needs one per swapped tensor: the count is checked here too), reads and writes submitted to its
async I/O library (libaio: O_DIRECT, ``queue_depth`` requests in flight over
``intra_op_parallelism`` threads) so they overlap each other (pipeline_read/write overlap them
with the neighbouring sub-group's step here too: pipelined_optimizer_swapper.py); and, when
pipelined, the fp32 gradients swapped out during backward, which minitron keeps in memory.
"""

from __future__ import annotations

import os

import torch

from minitron.runtime.swap_tensor.aio_config import AioConfig
from minitron.trace import traced


class PartitionedOptimizerSwapper:
    def __init__(self, config, aio: AioConfig, optimizer: torch.optim.Optimizer, rank: int):
        """``config``: the offload_optimizer section (zero/offload_config.py): nvme_path, buffer_count."""
        self.optimizer, self.aio, self.buffer_count = optimizer, aio, config.buffer_count
        self.swap_folder = os.path.join(config.nvme_path, "zero_stage_3", "optimizer", f"rank{rank}")
        os.makedirs(self.swap_folder, exist_ok=True)
        self.shapes: dict = {}   # swap path -> (numel, dtype) of the tensor it holds

    def swappable(self, numel: int, element_size: int = 4) -> bool:
        return numel * element_size >= self.aio.min_swap_bytes

    def _tensors(self, master: torch.Tensor) -> list:
        """(path, tensor) of the master and of each state tensor the optimizer keeps for it."""
        out = [(os.path.join(self.swap_folder, f"{master.ds_id}.tensor.swp"), master)]
        for key, value in self.optimizer.state.get(master, {}).items():
            if torch.is_tensor(value) and value.dim() > 0:   # the moments; not a step count
                out.append((os.path.join(self.swap_folder, f"{key}-{master.ds_id}.tensor.swp"), value))
        if len(out) > self.buffer_count:
            raise RuntimeError(f"offload_optimizer.buffer_count {self.buffer_count}: swapping a group needs one "
                               f"buffer per tensor, {len(out)} here (master and moments); raise it")
        return out

    def _aligned(self, nbytes: int) -> int:
        return -(-nbytes // self.aio.aligned_bytes) * self.aio.aligned_bytes

    @traced(args=lambda self, master, group, async_swap=False: {
        "group": group, "files": 1 + len(self.optimizer.state.get(master, {})),
        "bytes": master.numel() * master.element_size(), "async": async_swap})
    def swap_out_optimizer_state(self, master: torch.Tensor, group: int, async_swap: bool = False) -> None:
        """Write the group's tensors to their files, padded, and free the host copies.
        (``async_swap``: the pipelined swapper's; this one always writes at once.)"""
        _write(self._snapshot(master))

    def _snapshot(self, master: torch.Tensor) -> list:
        """(path, bytes padded to the I/O alignment) of each of the group's tensors, whose host
        copies are freed: the bytes are all that is left of them until they are read back."""
        out = []
        for path, t in self._tensors(master):
            data = t.detach().contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            out.append((path, data + bytes(self._aligned(len(data)) - len(data))))
            self.shapes[path] = (t.numel(), t.dtype, t.shape)
            t.data = torch.empty(0, dtype=t.dtype, device=t.device)
        return out

    @traced(args=lambda self, master, group, ahead=None: {"group": group})
    def swap_in_optimizer_state(self, master: torch.Tensor, group: int, ahead=None) -> None:
        """Read the group's files back into host tensors, the padding dropped. (``ahead``: the
        next swapped (master, group), which the pipelined swapper starts reading now.)"""
        self._fill(master, _read([path for path, _ in self._tensors(master)]))

    def _fill(self, master: torch.Tensor, raw: dict) -> None:
        for path, t in self._tensors(master):
            numel, dtype, shape = self.shapes[path]
            t.data = torch.frombuffer(raw[path], dtype=dtype, count=numel).view(shape)

    def files(self) -> list[str]:
        return sorted(os.listdir(self.swap_folder))


def _write(files: list) -> None:
    for path, data in files:
        with open(path, "wb") as f:
            f.write(data)


def _read(paths: list) -> dict:
    out = {}
    for path in paths:
        with open(path, "rb") as f:
            out[path] = bytearray(f.read())
    return out
