"""How ZeRO-3 cuts a param group into sub-groups, and which of them stay in host memory under
ZeRO-Infinity: the rules alone, torch-free, shared by the engine (stage3.py, param_swap.py) and
the estimate (training/theoretical_offload.py), which must cut exactly as the run does and is
read before any process starts, without torch.
"""

from __future__ import annotations


def sub_group_bounds(pieces: list, sub_group_size: int) -> list:
    """DeepSpeed's _create_fp16_sub_groups over a group's parameters, given each one's piece
    (my elements): [(first, end)] index ranges. A group whose pieces fit in ``sub_group_size``
    stays whole; otherwise parameters are taken in order and a sub-group closes once it holds
    that many elements, so one may exceed it by its last parameter. The estimate
    (training/theoretical_offload.py) cuts the same way."""
    if sub_group_size >= sum(pieces):
        return [(0, len(pieces))]
    out, first, numel = [], 0, 0
    for k, piece in enumerate(pieces):
        numel += piece
        if numel >= sub_group_size or k == len(pieces) - 1:
            out.append((first, k + 1))
            first, numel = k + 1, 0
    return out


def in_memory_sub_groups(groups: list, max_in_cpu: int) -> list:
    """``groups``: each param group's sub-groups' sizes (my elements). Whether each sub-group, in
    order, stays in host memory: DeepSpeed gives group j a host buffer of what still fits under
    ``max_in_cpu`` after the groups before it (all of the group if it fits whole), and a
    sub-group lives in that buffer if it fits after the group's sub-groups before it."""
    out, counted = [], 0
    for sizes in groups:
        total = sum(sizes)
        room = total if counted + total <= max_in_cpu else max(0, max_in_cpu - counted)
        room = max(room, 1)   # DeepSpeed's buffer for "no room" is torch.empty(1): one element fits
        counted, offset = counted + total, 0
        for size in sizes:
            out.append(offset + size <= room)
            offset += size
    return out
