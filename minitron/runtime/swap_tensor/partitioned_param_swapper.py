"""ZeRO-Infinity's parameter swapper: DeepSpeed 0.19.8's ``AsyncPartitionedParameterSwapper``
(``runtime/swap_tensor/partitioned_param_swapper.py``) and the stage-3 code that decides what it
holds (``_create_param_groups_fp16_flat_cpu_memory``, ``_partitioned_params_swap_out`` in
``zero/stage3.py``), in plain file I/O.

With ``offload_param.device: nvme`` a rank's stage-3 pieces (``param.ds_tensor``) start in host
memory, as with "cpu"; then:

    max_in_cpu    param group by param group, sub-groups are kept in host memory while the
                  pieces counted so far (elements, over all groups) fit in it; the sub-groups
                  past it go to NVMe. Default 1e9 elements: a small model never swaps
    the floor     in a sub-group on NVMe, a piece of at least max(1 MiB, aio.block_size) bytes
                  lives in its own file; a smaller one stays in host memory, on its own
    buffer_size   a swapped piece is read into one buffer of at most this many elements
    buffer_count  how many such buffers there are: swapped pieces in memory at once

    {nvme_path}/zero_stage_3/{dtype}params/rank{R}/{ds_id}_param.tensor.swp
                  one file per swapped piece, its bytes padded with zeros to a multiple of
                  aio.intra_op_parallelism x 1 KiB (the swap buffers' alignment)

A gather first reads the module's swapped pieces into buffers (``swap_in``); the release after
the module ran drops them (the file is unchanged: nothing wrote the piece); the step writes each
swapped piece's update from the fp32 master straight into its file (``swap_out``), cast to the
parameters' dtype. Between steps a swapped piece is a meta tensor of its size: its shape and
dtype without storage, so reading it by mistake fails at once (DeepSpeed leaves a one-element
placeholder there and keeps the size aside).

What DeepSpeed's adds: the buffers are one pinned block allocated up front (buffer_count x
buffer_size elements; here a buffer is allocated when a piece is read), the reads and writes go
through its async I/O library (libaio, O_DIRECT) and the coordinator prefetches the next modules'
pieces while this one computes (``prefetch_nvme``); here every read is blocking, at the gather.
"""

from __future__ import annotations

import os
import shutil

import torch

from minitron.runtime.swap_tensor.aio_config import AioConfig
from minitron.trace import traced


def swap_folder(nvme_path: str, dtype: torch.dtype, rank: int) -> str:
    return os.path.join(nvme_path, "zero_stage_3", f"{str(dtype).split('.')[1]}params", f"rank{rank}")


class AsyncPartitionedParameterSwapper:
    def __init__(self, config, aio: AioConfig, dtype: torch.dtype, rank: int):
        """``config``: the offload_param section (zero/offload_config.py); ``dtype``: the parameters'."""
        self.aio, self.dtype = aio, dtype
        self.buffer_count, self.buffer_size = config.buffer_count, config.buffer_size
        self.swap_folder = swap_folder(config.nvme_path, dtype, rank)
        shutil.rmtree(self.swap_folder, ignore_errors=True)   # DeepSpeed's: no stale files from another run
        os.makedirs(self.swap_folder, exist_ok=True)
        self.element_size = torch.empty(0, dtype=dtype, device="meta").element_size()   # no data: bytes per element only
        self.in_buffers: dict = {}   # ds_id -> the piece read back, while a gather holds it

    def swappable(self, numel: int) -> bool:
        return numel * self.element_size >= self.aio.min_swap_bytes

    def path(self, p) -> str:
        return os.path.join(self.swap_folder, f"{p.ds_id}_param.tensor.swp")

    def _aligned(self, nbytes: int) -> int:
        return -(-nbytes // self.aio.aligned_bytes) * self.aio.aligned_bytes

    def file_bytes(self, numel: int) -> int:
        return self._aligned(numel * self.element_size)

    @traced(args=lambda self, params, values: {"params": len(params),
                                               "bytes": sum(self.file_bytes(v.numel()) for v in values)})
    @torch.no_grad()
    def swap_out(self, params: list, values: list) -> None:
        """Each piece's new values (cast to the parameters' dtype) into its file, padded; a piece
        held in a buffer now takes them too. The first call (stage 3's init) also checks that a
        piece fits a buffer, as DeepSpeed's get_buffer asserts it."""
        for p, v in zip(params, values):
            if v.numel() > self.buffer_size:
                raise RuntimeError(f"offload_param.buffer_size {self.buffer_size}: parameter {p.ds_id} "
                                   f"{tuple(p.ds_shape)} has a piece of {v.numel()} elements to swap; raise it")
            data = v.detach().to(self.dtype).contiguous().view(-1).view(torch.uint8).numpy().tobytes()
            with open(self.path(p), "wb") as f:
                f.write(data + bytes(self._aligned(len(data)) - len(data)))
            if p.ds_id in self.in_buffers:
                p.ds_tensor.copy_(v)

    @traced(args=lambda self, params: {"params": len(params),
                                       "bytes": sum(self.file_bytes(p.ds_tensor.numel()) for p in params)})
    def swap_in(self, params: list) -> None:
        """Read the pieces' files into buffers (the padding dropped): ``ds_tensor`` is real again."""
        if len(self.in_buffers) + len(params) > self.buffer_count:
            raise RuntimeError(f"offload_param.buffer_count {self.buffer_count}: {len(self.in_buffers)} swapped "
                               f"pieces are held and {len(params)} more are needed for one gather; raise it")
        for p in params:
            numel = p.ds_tensor.numel()
            with open(self.path(p), "rb") as f:
                raw = bytearray(f.read())
            self.in_buffers[p.ds_id] = p.ds_tensor = torch.frombuffer(raw, dtype=self.dtype, count=numel)

    def release(self, params: list) -> None:
        """Give the buffers back; the pieces go back to being their files (no write: unchanged)."""
        for p in params:
            if self.in_buffers.pop(p.ds_id, None) is not None:
                p.ds_tensor = torch.empty(p.ds_tensor.shape, dtype=self.dtype, device="meta")

    def files(self) -> dict:
        return {f: os.path.getsize(os.path.join(self.swap_folder, f)) for f in sorted(os.listdir(self.swap_folder))}
