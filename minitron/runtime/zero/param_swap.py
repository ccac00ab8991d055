"""Stage 3's side of ZeRO-Infinity's parameter swapping (``offload_param.device: nvme``): which
sub-groups' pieces go to files, and the three moments a swapped piece moves, as DeepSpeed
0.19.8's stage3.py / partition_parameters.py move it. The files themselves are the swapper's
(swap_tensor/partitioned_param_swapper.py, where max_in_cpu, buffer_count and buffer_size are
explained).

    init      a sub-group past max_in_cpu loses its flat host buffer: each piece over the
              swap floor is written to its file and becomes a meta tensor; the others are
              kept in host memory on their own
    gather    before the all-gather, the module's swapped pieces are read into buffers
              (DeepSpeed's ``_ensure_availability_of_partitioned_params``); a persistent
              parameter stays whole, so its buffer goes back at once
    release   after the module ran, the buffers go back (nothing changed the pieces)
    step      the updated fp32 master of a swapped piece is written, cast, into its file
              (``_partitioned_params_swap_out``); a piece in host memory takes it as with "cpu"

Swapped pieces are read and written as they are: the same bytes as the host pieces of
offload_param "cpu", so the two runs compute the same numbers.
"""

from __future__ import annotations

import torch

from minitron.runtime.swap_tensor.aio_config import AioConfig
from minitron.runtime.swap_tensor.partitioned_param_swapper import AsyncPartitionedParameterSwapper
from minitron.runtime.zero.sub_groups import in_memory_sub_groups


class PartitionedParamSwapping:
    """Needs from stage 3's optimizer: ``fp16_groups``, ``fp16_partitioned_groups_flat``,
    ``sub_group_to_group_id``, ``single_partition_of_fp32_groups`` and ``offload``."""

    def _nvme_params(self, offload_param, aio, rank: int) -> None:
        self.param_swapper, self.params_swapped = None, set()
        if offload_param is None or offload_param.device != "nvme" or not self._group_of:
            return
        dtype = next(iter(self._group_of)).ds_tensor.dtype
        self.param_swapper = AsyncPartitionedParameterSwapper(offload_param, aio or AioConfig(), dtype, rank)
        sizes = [sum(p.ds_tensor.numel() for p in params) for params in self.fp16_groups]
        groups = [[n for n, g in zip(sizes, self.sub_group_to_group_id) if g == j]
                  for j in dict.fromkeys(self.sub_group_to_group_id)]
        for s, in_memory in enumerate(in_memory_sub_groups(groups, offload_param.max_in_cpu)):
            if in_memory:
                continue
            swap = [p for p in self.fp16_groups[s] if self.param_swapper.swappable(p.ds_tensor.numel())]
            if swap:
                self.param_swapper.swap_out(swap, [p.ds_tensor for p in swap])
            for p in self.fp16_groups[s]:   # no view may keep the flat buffer alive
                swapped = any(p is q for q in swap)
                p.ds_tensor = torch.empty(p.ds_tensor.shape, dtype=dtype, device="meta") if swapped \
                    else p.ds_tensor.clone()
                if swapped:
                    self.params_swapped.add(p)
            self.fp16_partitioned_groups_flat[s] = None

    def _swap_in(self, params: list) -> None:
        """Before a gather: the swapped pieces among ``params`` into buffers."""
        todo = [p for p in params if p in self.params_swapped]
        if todo:
            self.param_swapper.swap_in(todo)

    def _release_swapped(self, params: list) -> None:
        if self.param_swapper is not None:
            self.param_swapper.release([p for p in params if p in self.params_swapped])

    def _publish_swapped(self, s: int) -> None:
        """Sub-group s has no flat buffer: each piece takes its slice of the updated master, in
        its file or in host memory. A swapped piece's slice is cast into a host tensor first (the
        crossing a master on the device makes, traced as with "cpu"; DeepSpeed's pinned swap
        buffer), then written."""
        master, offset, swap, values = self.single_partition_of_fp32_groups[s], 0, [], []
        for p in self.fp16_groups[s]:
            part = master.narrow(0, offset, p.ds_tensor.numel())
            offset += p.ds_tensor.numel()
            if p in self.params_swapped:
                staged = torch.empty(part.shape, dtype=p.ds_tensor.dtype, device=self.offload.host)
                self.offload.publish(part, staged, s, dest_on_host=True)
                swap.append(p)
                values.append(staged)
            else:
                self.offload.publish(part, p.ds_tensor, s, dest_on_host=True)
        if swap:
            self.param_swapper.swap_out(swap, values)

    def _loose_pieces_bytes(self) -> int:
        """Host bytes of the pieces of sub-groups without a flat buffer (the swapped ones: none)."""
        return sum(p.ds_tensor.numel() * p.ds_tensor.element_size()
                   for s, flat in enumerate(self.fp16_partitioned_groups_flat) if flat is None
                   for p in self.fp16_groups[s] if p not in self.params_swapped)

    def nvme_bytes_held(self) -> dict:
        """Bytes in this rank's swap files: the parameters' (the optimizer's states: swap_tensor/)."""
        return {"params": sum(self.param_swapper.files().values()) if self.param_swapper is not None else 0}
