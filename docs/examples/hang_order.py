"""The classic deadlock: two ranks call collectives on two groups in a different order.

    minitron launch --world 2 --trace t --hang-timeout 2 docs/examples/hang_order.py

Both groups hold ranks 0 and 1. Rank 0 all-reduces on GROUP_A, then GROUP_B; rank 1 on GROUP_B,
then GROUP_A. Each waits in its first call for the other, who is waiting in a different group.
The fix: every rank calls the collectives of its groups in one order (Megatron's schedules do
the same steps in the same order on every rank).
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
group_a = dist.new_group([0, 1], group_desc="GROUP_A")
group_b = dist.new_group([0, 1], group_desc="GROUP_B")
first, second = (group_a, group_b) if rank == 0 else (group_b, group_a)   # the bug
dist.all_reduce(torch.ones(2), group=first)
dist.all_reduce(torch.ones(2), group=second)
dist.destroy_process_group()
