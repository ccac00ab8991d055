"""ZeRO-Infinity's pipelined swapper: DeepSpeed 0.19.8's ``PipelinedOptimizerSwapper``
(``runtime/swap_tensor/pipelined_optimizer_swapper.py``), with a thread in place of each of its
two async I/O handles.

Stage 3 steps its sub-groups one after another (zero/stage3.py). The plain swapper reads a
sub-group's files, the optimizer steps it, and the swapper writes them back, each move waiting
for the one before. ``offload_optimizer.pipeline_read`` and ``pipeline_write`` let the files'
I/O run beside the step:

    pipeline_read    once sub-group s is read in, start reading the next swapped sub-group's
                     files; its swap-in then only waits for what is still on its way
    pipeline_write   sub-group s's files are written while the next sub-group is read and
                     stepped; the next swap-out waits for that write first. The last one of a
                     step is written at once, so a step ends with every file on disk

Every move stays a traced call on the rank's own thread (``swap_in_optimizer_state``,
``start_swap_in``, ``swap_out_optimizer_state`` with ``async``, ``complete_swap_out``); only
the bytes move on the I/O threads. The numbers are the plain swapper's.

Buffers: DeepSpeed's reads and writes go through ``buffer_count`` pinned buffers, one per
tensor, and it asserts when a move finds too few free. Pipelined, a sub-group's buffers stay
taken while its read is ahead or its write is in flight, so up to three sub-groups' tensors
(the one written, the one stepped, the one read ahead) are held at once; the count is kept
here too, and a move that would exceed it stops with the number it needs.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import torch

from minitron.runtime.swap_tensor.optimizer_swapper import PartitionedOptimizerSwapper, _read, _write
from minitron.trace import traced


class PipelinedOptimizerSwapper(PartitionedOptimizerSwapper):
    def __init__(self, config, aio, optimizer: torch.optim.Optimizer, rank: int):
        super().__init__(config, aio, optimizer, rank)
        self.async_swap_in, self.async_swap_out = config.pipeline_read, config.pipeline_write
        # DeepSpeed's read_aio_handle and write_aio_handle: one I/O thread for each direction
        self.reader, self.writer = ThreadPoolExecutor(1), ThreadPoolExecutor(1)
        self.reading = None   # (group, future, buffers) of the read ahead
        self.writing = None   # (group, future, buffers) of the write in flight
        self.held = 0         # buffers of the sub-group being stepped

    def _take(self, count: int, what: str) -> None:
        in_flight = sum(move[2] for move in (self.reading, self.writing) if move is not None)
        if self.held + in_flight + count > self.buffer_count:
            raise RuntimeError(f"offload_optimizer.buffer_count {self.buffer_count}: pipelined swapping holds "
                               f"{self.held + in_flight + count} buffers when it {what} (one per tensor of each "
                               "sub-group stepped, read ahead or still being written); raise it")

    @traced(args=lambda self, master, group, ahead=None: {"group": group})
    def swap_in_optimizer_state(self, master: torch.Tensor, group: int, ahead=None) -> None:
        tensors = self._tensors(master)
        if self.reading is not None and self.reading[0] == group:   # read ahead: wait for what is left
            raw, count = self.reading[1].result(), self.reading[2]
            self.reading = None
        else:
            count = len(tensors)
            self._take(count, f"reads sub-group {group}")
            raw = _read([path for path, _ in tensors])
        self._fill(master, raw)
        self.held = count
        if self.async_swap_in and ahead is not None:
            self.start_swap_in(*ahead)

    @traced(args=lambda self, master, group: {"group": group})
    def start_swap_in(self, master: torch.Tensor, group: int) -> None:
        """pipeline_read: the next sub-group's files, read on the I/O thread from now on."""
        paths = [path for path, _ in self._tensors(master)]
        self._take(len(paths), f"starts reading sub-group {group} ahead")
        self.reading = (group, self.reader.submit(_read, paths), len(paths))

    @traced(args=lambda self, master, group, async_swap=False: {
        "group": group, "files": 1 + len(self.optimizer.state.get(master, {})),
        "bytes": master.numel() * master.element_size(), "async": async_swap and self.async_swap_out})
    def swap_out_optimizer_state(self, master: torch.Tensor, group: int, async_swap: bool = False) -> None:
        if self.writing is not None:
            self.complete_swap_out()
        files, self.held = self._snapshot(master), 0
        if self.async_swap_out and async_swap:
            self.writing = (group, self.writer.submit(_write, files), len(files))
        else:
            _write(files)

    @traced(args=lambda self: {"group": self.writing[0]})
    def complete_swap_out(self) -> None:
        """Wait for the write in flight; its buffers are free again."""
        self.writing[1].result()
        self.writing = None
