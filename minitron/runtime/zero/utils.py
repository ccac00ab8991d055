"""DeepSpeed's ``zero/utils.py`` checks that ranks agree, used by ``enable_sanity_checks``."""

from __future__ import annotations

import torch

from minitron import comm as dist
from minitron.accelerator import get_accelerator


def assert_ints_same_as_other_ranks(ints: list) -> None:
    """Rank 0's list, broadcast (its length first, then the list), against mine: ranks that
    disagree would reduce different parameters' gradients into each other. Two collectives
    for every check, which is why DeepSpeed runs it only when asked."""
    device = torch.device(get_accelerator().current_device_name())
    length = torch.tensor([len(ints) if dist.get_rank() == 0 else -1], device=device)
    dist.broadcast(length, src=0)
    if int(length.item()) != len(ints):
        raise RuntimeError(f"enable_sanity_checks: rank 0 reduces {int(length.item())} parameters here and rank "
                           f"{dist.get_rank()} {len(ints)}: the ranks' backward passes differ")
    theirs = torch.tensor(ints if dist.get_rank() == 0 else [-1] * len(ints), dtype=torch.long, device=device)
    dist.broadcast(theirs, src=0)
    if theirs.tolist() != list(ints):
        raise RuntimeError(f"enable_sanity_checks: rank 0 reduces parameters {theirs.tolist()} here and rank "
                           f"{dist.get_rank()} {list(ints)}: the ranks' backward passes differ")
