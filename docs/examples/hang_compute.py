"""A rank stuck in compute: rank 2 never leaves its forward step while the others wait.

    minitron launch --world 4 --trace t --hang-timeout 2 docs/examples/hang_compute.py

Nothing is out of order here: ranks 0, 1 and 3 wait in the gradients' all-reduce for rank 2,
which is still computing (an endless loop, a dead data loader, a GPU kernel that never ends).
The diagnosis shows the traced step rank 2 is in and its Python stack: the place to look.
The fix is in that step; the collective is innocent.
"""

import time

import torch
import torch.distributed as dist

from minitron.trace import traced


@traced
def forward_step(rank: int) -> torch.Tensor:
    while rank == 2:   # the bug: a loop that never ends on one rank
        time.sleep(0.05)
    return torch.ones(4)


dist.init_process_group("gloo")
rank = dist.get_rank()
grad = forward_step(rank)
dist.all_reduce(grad)
dist.destroy_process_group()
