"""A new_group called by only some ranks: ranks 0 and 1 make their pair's group, 2 and 3 do not.

    minitron launch --world 4 --trace t --hang-timeout 2 docs/examples/hang_new_group.py

torch numbers the groups in the order a rank creates them, and the ranks of a group find each
other under that number. Ranks 0 and 1 make PAIR_GROUP first, so ALL_GROUP is their second
group; ranks 2 and 3 skipped PAIR_GROUP, so it is their first. All four enter the all-reduce on
"ALL_GROUP", under two different numbers: two halves that wait for each other for ever.
The fix: every rank creates every group, in the same order, members or not, as Megatron's
initialize_model_parallel does (it loops over all the groups on every rank and keeps its own).
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank in (0, 1):   # the bug: only the members create the group
    pair = dist.new_group([0, 1], group_desc="PAIR_GROUP")
everyone = dist.new_group([0, 1, 2, 3], group_desc="ALL_GROUP")
dist.all_reduce(torch.ones(2), group=everyone)
dist.destroy_process_group()
