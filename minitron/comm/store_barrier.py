"""A barrier through the rendezvous store: every rank of the world waits here for the others,
and no process group connects anything for it.

Why not ``torch.distributed.barrier()``: gloo connects a group's ranks on the group's first
collective (TORCH_GLOO_LAZY_INIT, which the launcher sets, as NCCL does by default), so a
first barrier on the world opens a connection between every pair of ranks (120 of them at
16 ranks, ~15 ms of CPU per rank) only to say goodbye. The store that init_process_group
rendezvoused through counts arrivals with one ``add`` per rank and releases everyone with
one key; that is also how torch itself waits for the ranks after creating a group when asked
(TORCH_DIST_INIT_BARRIER=1).
"""

from __future__ import annotations

import itertools
from datetime import timedelta

import torch.distributed as dist

from minitron.trace import traced

_CALLS = itertools.count()  # every rank makes the same calls in the same order: same keys


@traced
def store_barrier(timeout: timedelta = timedelta(minutes=5)) -> None:
    """Return once every rank of the world has called this (its n-th call pairs with theirs)."""
    if dist.get_backend() != "gloo":
        # nccl: a barrier is one small all-reduce on communicators that exist anyway; a fake
        # world's store counts nothing and its collectives return at once.
        dist.barrier()
        return
    store = dist.distributed_c10d._get_default_store()
    key = f"minitron/store_barrier/{next(_CALLS)}"
    if store.add(key, 1) == dist.get_world_size():
        store.set(key + "/all", "1")  # the last to arrive lets everyone go
    store.wait([key + "/all"], timeout)
