"""ZeRO++'s weight side: hpZ and qwZ (DeepSpeed 0.19.8 keeps them in ``zero/partition_parameters.py``;
qgZ, the gradient side, is runtime/comm/coalesced_collectives.py).

hpZ (``zero_hpz_partition_size`` h): the ranks are cut into groups of h consecutive ranks, a
node's worth (DeepSpeed's ``_create_zero_param_parallel_group``). Besides its dp piece, a rank
keeps a *secondary* piece of every parameter: 1/h of it, cut out of the full parameter when a
module releases it (``ds_secondary_tensor``). A gather finds secondary pieces and all-gathers
them among the h ranks of the group, inside the node, instead of among all dp ranks. The step
changes the weights, so it drops the secondary pieces: the first forward after a step gathers
from everyone, and the backward after it from the node.

qwZ (``zero_quantized_weights``): a gather sends int8 codes and one fp32 scale per block
(ops/quantizer) in place of the weights, two all-gathers, and each rank dequantizes what arrives.
Only the gathered copy is rounded; the pieces, the fp32 master and the update stay exact.
"""

from __future__ import annotations

import torch

from minitron import comm as dist
from minitron.ops.quantizer.quantizer import dequantize, quantize, weight_groups


class ZeroPlusPlus:
    def __init__(self, dp_process_group, hpz_partition_size: int, quantized_weights: bool):
        world = dist.get_world_size()
        if dist.get_world_size(group=dp_process_group) != world and hpz_partition_size > 1:
            raise ValueError("zero_hpz_partition_size needs data parallelism over every rank: DeepSpeed "
                             "builds its groups from world ranks; drop it or the model parallelism")
        self.dp_process_group, self.dp = dp_process_group, dist.get_world_size(group=dp_process_group)
        self.hpz = max(1, min(hpz_partition_size, world))
        if world % self.hpz:
            raise ValueError(f"zero_hpz_partition_size {hpz_partition_size} must divide the {world} ranks")
        self.quantized_weights = quantized_weights
        self.intra_group, self.rank_in_group = None, dist.get_rank() % self.hpz
        if self.hpz > 1:
            for i in range(world // self.hpz):   # every rank makes every group (new_group is collective)
                group = dist.new_group(range(i * self.hpz, (i + 1) * self.hpz),
                                       group_desc="ZERO_PARAM_INTRA_PARALLEL_GROUP")
                if i == dist.get_rank() // self.hpz:
                    self.intra_group = group

    def check(self, params: list) -> None:
        """qwZ's blocks need every gather's elements to be a multiple of 8 (DeepSpeed asserts
        it when the gather runs); each piece being one is enough, whatever is gathered together."""
        if not self.quantized_weights:
            return
        for p in params:
            for numel in {p.ds_tensor.numel(), self._secondary_numel(p)}:
                if numel % 8:
                    raise ValueError(f"zero_quantized_weights: a parameter of shape {tuple(p.ds_shape)} is cut "
                                     f"into pieces of {numel} elements, not a multiple of 8; change the size "
                                     "or the data-parallel size, or drop zero_quantized_weights")

    def _secondary_numel(self, p) -> int:
        return p.ds_tensor.numel() * self.dp // self.hpz

    def keep_secondary(self, p) -> None:
        """Before a full parameter is released: keep my 1/h of it (DeepSpeed's _partition_param_sec)."""
        if self.hpz == 1 or getattr(p, "ds_secondary_tensor", None) is not None:
            return
        size = self._secondary_numel(p)
        start, flat = size * self.rank_in_group, p.data.reshape(-1)
        piece = flat.new_zeros(size)
        n = max(0, min(p.ds_numel - start, size))
        piece[:n].copy_(flat[start:start + n])
        p.ds_secondary_tensor = piece

    def invalidate_secondary(self, params) -> None:
        """After the step: the secondary pieces hold old weights (DeepSpeed's invalidate_secondary_tensor)."""
        for p in params:
            p.ds_secondary_tensor = None

    def uses_secondary(self, params: list) -> bool:
        """hpZ: a gather of ``params`` reads the node's secondary pieces (all have one)."""
        return self.hpz > 1 and all(getattr(p, "ds_secondary_tensor", None) is not None for p in params)

    @torch.no_grad()
    def all_gather(self, params: list, to_device=lambda t: t) -> None:
        """One gather of ``params`` (one dtype): from the node's secondary pieces when all have
        one, else from every dp rank's piece; int8 blocks and their scales under qwZ.
        ``to_device`` brings my pieces, end to end, where the collective runs (offload_param)."""
        secondary = self.uses_secondary(params)
        pieces = [p.ds_secondary_tensor if secondary else p.ds_tensor for p in params]
        group, world = (self.intra_group, self.hpz) if secondary else (self.dp_process_group, self.dp)
        mine = to_device(torch.cat(pieces))
        if self.quantized_weights:
            codes, scales = quantize(mine, weight_groups(mine.numel()), 8)
            all_codes, all_scales = codes.new_empty(world * codes.numel()), scales.new_empty(world * scales.numel())
            dist.all_gather_into_tensor(all_codes, codes, group=group)
            dist.all_gather_into_tensor(all_scales, scales, group=group)
            full = dequantize(all_codes, all_scales, 8).to(mine.dtype)
        else:
            full = mine.new_empty(world * mine.numel())
            dist.all_gather_into_tensor(full, mine, group=group)
        full, offset = full.view(world, mine.numel()), 0
        for p, piece in zip(params, pieces):
            p.data = full[:, offset:offset + piece.numel()].reshape(-1)[:p.ds_numel].view(p.ds_shape)
            p.ds_status = "AVAILABLE"
            offset += piece.numel()
