"""A pipeline send without its receive: stage 0 sends an activation that stage 1 never receives.

    minitron launch --world 2 --trace t --hang-timeout 2 docs/examples/hang_send.py

A send completes only once its peer posts the matching receive. Rank 1 goes on to the barrier
instead, where it waits for rank 0, which waits in its send for rank 1.
The fix: each send has its receive on the peer, in the same order (Megatron's p2p_communication
posts both sides of every exchange in one batch_isend_irecv).
"""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
activation = torch.ones(2, 8)
if rank == 0:
    dist.send(activation, dst=1)
# the bug: rank 1 should `dist.recv(activation, src=0)` here
dist.barrier()
dist.destroy_process_group()
