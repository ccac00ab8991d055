"""How stage 3 fetches a module's partitioned parameters: DeepSpeed 0.19.8's
``all_gather_coalesced`` (``zero/partition_parameters.py``), its three ways.

    coalesced (the default)   the missing parameters of one dtype go in one collective: my
                              pieces end to end, every rank's come back (zeropp.py, which also
                              serves hpZ's secondary pieces and qwZ's int8 blocks)
    sequential                ``stage3_allgather_sequential``, or a single parameter: one
                              all-gather per parameter, each straight into its own buffer. More
                              calls, no flat copy of the pieces first
    all-reduce                ``stage3_use_all_reduce_for_fetch_params`` (several parameters,
                              neither quantized nor from hpZ's secondary pieces): a zeroed buffer
                              with room for every parameter whole, each rank writes its pieces
                              where they belong and one all-reduce sums the buffer, so every
                              parameter lands whole in place, with no slicing after. The sum adds
                              zeros only, so the values are exact in any dtype

DeepSpeed checks for sequential first: the all-reduce only replaces a coalesced gather.
"""

from __future__ import annotations

import torch

from minitron import comm as dist
from minitron.trace import traced


def print_rank_0(message: str) -> None:
    """DeepSpeed's print_rank_0 of this module, as its callers use it (force=True): rank 0 prints.
    ZeRO's own, because runtime/ stands below training/ and cannot borrow training's."""
    if dist.get_rank() == 0:
        print(message, flush=True)


def fetch(params: list, zeropp, to_device, sequential: bool = False, all_reduce: bool = False) -> None:
    """Gather ``params`` (one dtype, all missing). ``to_device`` brings host pieces across
    (offload_param)."""
    if sequential or len(params) == 1:
        for p in params:
            zeropp.all_gather([p], to_device)
    elif all_reduce and not zeropp.quantized_weights and not zeropp.uses_secondary(params):
        all_reduce_fetch(params, zeropp.dp_process_group, to_device)
    else:
        zeropp.all_gather(params, to_device)


@traced(args=lambda params, group, to_device: {"params": len(params),
                                               "elements": sum(p.ds_tensor.numel() for p in params)
                                               * dist.get_world_size(group=group)})
@torch.no_grad()
def all_reduce_fetch(params: list, group, to_device) -> None:
    """Each parameter's region is its pieces' length x dp (ds_numel_aligned); rank r's piece
    goes at r x piece in it, zeros elsewhere; the sum over ranks is the whole parameter."""
    world, rank = dist.get_world_size(group=group), dist.get_rank(group=group)
    mine = to_device(torch.cat([p.ds_tensor for p in params]))
    flat = mine.new_zeros(mine.numel() * world)
    start, at = 0, 0
    for p in params:
        piece = p.ds_tensor.numel()
        flat.narrow(0, start + piece * rank, piece).copy_(mine.narrow(0, at, piece))
        p.data = flat.narrow(0, start, p.ds_numel).view(p.ds_shape)
        p.ds_status = "AVAILABLE"
        start, at = start + piece * world, at + piece
    dist.all_reduce(flat, group=group)
