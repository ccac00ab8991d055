"""qgZ's gradient reduce-scatter (ZeRO++): DeepSpeed 0.19.8's ``all_to_all_quant_reduce``
(``runtime/comm/coalesced_collectives.py``), with its CUDA kernels (``swizzle_quant``,
``quantized_reduction``, ``dequantize``) as torch arithmetic (ops/quantizer/quantizer.py).

Plain ZeRO-3 reduce-scatters each gradient in its own dtype: every rank sends (dp - 1)/dp of it.
qgZ sends int4 instead, in two all-to-alls, the first inside a node and the second between nodes:

    1. cut the gradient into dp partitions (partition r is rank r's ZeRO piece), reorder them so
       that local rank d's share (the partitions of ranks d, d + L, d + 2L, ..., L ranks a node)
       lies together, and quantize it all to int4 in blocks (max(rows, columns, dp) of them)
    2. all-to-all inside the node: local rank d receives every local peer's share d
    3. dequantize the L shares, add them up (in fp16, as the kernel does), quantize to int4 again
    4. all-to-all between the nodes, among the ranks with the same local index: each receives
       its own partition as summed on every node
    5. dequantize, add the nodes' sums and divide by the number of nodes

Step 5 is DeepSpeed's as written: a sum over all dp ranks divided by the number of nodes, L
times the mean that plain ZeRO-3 (and qgZ's own fallback) hands the optimizer. 1-D gradients
(biases, norms) and those whose size 2 × dp does not divide take the fallback: the plain
reduce-scatter, which averages.

A rank's inputs are read as fp16, the dtype the kernels take (``swizzle_quant`` reads its input
through a ``__half*``).
"""

from __future__ import annotations

import os

import torch

from minitron import comm as dist
from minitron.ops.quantizer.groups import gradient_groups, qgz_applies  # noqa: F401 -- stage3.py's test
from minitron.ops.quantizer.quantizer import dequantize, quantize
from minitron.trace import traced


def ranks_per_node(world: int) -> int:
    """DeepSpeed asks its accelerator's device_count(); its CPU accelerator answers LOCAL_SIZE,
    which minitron's launchers set (the whole world, on one machine). A test fakes two nodes
    by setting it smaller."""
    return int(os.environ.get("LOCAL_SIZE", world)) or world


def all_to_all_groups(world: int, local: int) -> dict:
    """DeepSpeed's _get_local_all_to_all_group with more than one node: ``local_{i}`` holds node
    i's ranks, ``global_{d}`` the ranks with local index d on every node. Every rank makes every
    group (torch's new_group is collective)."""
    groups = {}
    for i in range(world // local):
        groups[f"local_{i}"] = dist.new_group(range(i * local, (i + 1) * local), group_desc="QGZ_LOCAL")
    for d in range(local):
        groups[f"global_{d}"] = dist.new_group(range(d, world, local), group_desc="QGZ_GLOBAL")
    return groups


def qgz_groups(dp: int):
    """What all_to_all_quant_reduce needs, or None where qgZ does not run: on one node DeepSpeed
    reduce-scatters as plain ZeRO-3 does. Refused where dp is not the whole world (DeepSpeed
    builds its groups from world ranks)."""
    world = dist.get_world_size()
    if dp != world:
        raise ValueError("zero_quantized_gradients needs data parallelism over every rank: DeepSpeed "
                         "builds its all-to-all groups from world ranks; drop it or the model parallelism")
    local = ranks_per_node(world)
    if world <= local:
        return None
    if world % local:
        raise ValueError(f"zero_quantized_gradients: {world} ranks are not whole nodes of {local} (LOCAL_SIZE)")
    return {"groups": all_to_all_groups(world, local), "world": world, "local": local}


def swizzle_slots(world: int, local: int) -> list:
    """Where swizzled_quant_kernel puts partition p: slot (p % L) * nodes + p // L, so that the
    partitions local rank d gathers for (d, d + L, ...) lie together, one node after another."""
    nodes = world // local
    return [(p % local) * nodes + p // local for p in range(world)]


@traced(args=lambda tensor, groups, world, local: {"numel": tensor.numel(), "nodes": world // local})
@torch.no_grad()
def all_to_all_quant_reduce(tensor: torch.Tensor, groups: dict, world: int, local: int) -> torch.Tensor:
    """My partition of the gradient summed over all ranks and divided by the number of nodes
    (fp16, numel / world elements), through int4 all-to-alls (see the margin above)."""
    rank, nodes = dist.get_rank(), world // local
    node, local_rank = rank // local, rank % local
    blocks = gradient_groups(tuple(tensor.shape), world)   # intra_quant_group
    parts = tensor.detach().reshape(world, -1).to(torch.half)
    slots = torch.tensor(swizzle_slots(world, local), device=parts.device)
    swizzled = torch.empty_like(parts)
    swizzled[slots] = parts
    codes, scales = quantize(swizzled, blocks, 4)
    got_codes, got_scales = torch.empty_like(codes), torch.empty_like(scales)
    dist.all_to_all_single(got_codes, codes, group=groups[f"local_{node}"])
    dist.all_to_all_single(got_scales, scales, group=groups[f"local_{node}"])
    # quantized_reduction: the L shares dequantized and added in fp16, then int4 again
    shares = dequantize(got_codes, got_scales, 4).reshape(local, -1)
    total = torch.zeros_like(shares[0])
    for share in shares:
        total = total + share
    codes, scales = quantize(total, blocks // local, 4)      # inter_quant_group
    got_codes, got_scales = torch.empty_like(codes), torch.empty_like(scales)
    dist.all_to_all_single(got_codes, codes, group=groups[f"global_{local_rank}"])
    dist.all_to_all_single(got_scales, scales, group=groups[f"global_{local_rank}"])
    per_node = dequantize(got_codes, got_scales, 4).chunk(nodes)
    return sum(per_node) / nodes
