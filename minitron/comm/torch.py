"""TorchBackend: the object behind ``cdb``. Each method is one torch.distributed call.

DeepSpeed's version also checks which torch features exist (all_gather_into_tensor arrived
in 1.13, for instance) and wraps calls for its comms logger. The essence is what is left here:
constructing the backend initialises the default process group, and every collective is
forwarded unchanged. That is why the seed note's author found "DeepSpeed has no NCCL code of
its own": the communication is torch's; DeepSpeed adds a seam where another backend could go.
"""

from __future__ import annotations

from datetime import timedelta

import torch

from minitron.trace import traced


# --8<-- [start:torch-backend]
class TorchBackend:
    """Forwards to torch.distributed; creating one initialises the default group if needed."""

    def __init__(self, backend: str | None, timeout: timedelta, init_method: str | None = None,
                 rank: int = -1, world_size: int = -1, name: str = "torch"):
        self.name = name
        self.backend = backend
        if not torch.distributed.is_initialized():
            self.init_process_group(backend, timeout, init_method, rank, world_size)
        self.initialized = True

    @traced(name="minitron.comm.torch.TorchBackend.init_process_group")
    def init_process_group(self, backend, timeout, init_method, rank, world_size):
        kwargs = {"backend": backend, "timeout": timeout, "init_method": init_method,
                  "rank": rank, "world_size": world_size}
        if backend == "fake":
            # torch's fake process group: a world of any size in one process; collectives
            # return at once and move no data. Importing the module registers the backend
            # (only here: it is torch's test machinery, which no real run should load).
            from torch.testing._internal.distributed.fake_pg import FakeStore
            kwargs["store"] = FakeStore()
            kwargs.pop("init_method")
        torch.distributed.init_process_group(**kwargs)
    # --8<-- [end:torch-backend]

    def is_initialized(self) -> bool:
        return torch.distributed.is_initialized()

    def get_rank(self, group=None) -> int:
        return torch.distributed.get_rank(group=group)

    def get_world_size(self, group=None) -> int:
        return torch.distributed.get_world_size(group=group)

    def get_global_rank(self, group, group_rank):
        return torch.distributed.get_global_rank(group, group_rank)

    def get_world_group(self):
        return torch.distributed.group.WORLD

    # Each collective is called through the torch.distributed module, by attribute: that is
    # where the trace's wrappers sit (trace/torch_hooks.py), so the trace records torch's call.
    def all_reduce(self, tensor, op=torch.distributed.ReduceOp.SUM, group=None, async_op=False):
        return torch.distributed.all_reduce(tensor=tensor, op=op, group=group, async_op=async_op)

    def reduce(self, tensor, dst, op=torch.distributed.ReduceOp.SUM, group=None, async_op=False):
        return torch.distributed.reduce(tensor=tensor, dst=dst, op=op, group=group, async_op=async_op)

    def broadcast(self, tensor, src, group=None, async_op=False):
        return torch.distributed.broadcast(tensor=tensor, src=src, group=group, async_op=async_op)

    def all_gather(self, tensor_list, tensor, group=None, async_op=False):
        return torch.distributed.all_gather(tensor_list, tensor, group=group, async_op=async_op)

    def all_gather_into_tensor(self, output_tensor, input_tensor, group=None, async_op=False):
        return torch.distributed.all_gather_into_tensor(output_tensor=output_tensor, input_tensor=input_tensor,
                                                        group=group, async_op=async_op)

    def reduce_scatter_tensor(self, output_tensor, input_tensor, op=torch.distributed.ReduceOp.SUM, group=None,
                              async_op=False):
        return torch.distributed.reduce_scatter_tensor(output_tensor, input_tensor, op=op, group=group,
                                                       async_op=async_op)

    def all_to_all_single(self, output, input, group=None, async_op=False):
        return torch.distributed.all_to_all_single(output, input, group=group, async_op=async_op)

    def barrier(self, group=None):
        return torch.distributed.barrier(group=group)

    # Point to point, for DeepSpeed's pipeline engine (runtime/pipe/p2p.py): blocking, world ranks.
    def send(self, tensor, dst, group=None, tag=0):
        return torch.distributed.send(tensor=tensor, dst=dst, group=group, tag=tag)

    def recv(self, tensor, src=None, group=None, tag=0):
        return torch.distributed.recv(tensor=tensor, src=src, group=group, tag=tag)

    def new_group(self, ranks, group_desc=None):
        return torch.distributed.new_group(ranks=ranks, group_desc=group_desc)

    def destroy_process_group(self, group=None):
        torch.distributed.destroy_process_group(group)
