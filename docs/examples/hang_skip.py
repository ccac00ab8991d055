"""A rank that skips a collective: rank 1 leaves out the second step's all-reduce.

    minitron launch --world 4 --trace t --hang-timeout 2 docs/examples/hang_skip.py [STEP]

STEP (default 1) is the step whose all-reduce rank 1 leaves out.

Every rank counts the collectives it calls on a group; the k-th call of one rank meets the k-th
call of the others. Rank 1's third call on the world group is the barrier, while the others'
third call is the all-reduce it skipped: they never meet, and every rank waits for ever.
The fix: the collective runs on every rank of its group, so no rank may skip it on a condition
that is its own (here: `if not (rank == 1 and step == 1)`).
"""

import sys

import torch
import torch.distributed as dist

skipped = int(sys.argv[1]) if len(sys.argv) > 1 else 1

dist.init_process_group("gloo")
rank = dist.get_rank()
grad = torch.ones(4)
for step in range(3):
    if not (rank == 1 and step == skipped):   # the bug: one rank's own condition around a collective
        dist.all_reduce(grad)
dist.barrier()
dist.destroy_process_group()
