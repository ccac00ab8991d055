"""DeepSpeed-style communication front end: init_distributed and the backend object ``cdb``.

DeepSpeed does not talk to NCCL itself. ``deepspeed.comm`` keeps one module-level object,
``cdb`` ("communication data backend"), and that object is a TorchBackend: a thin class whose
methods call ``torch.distributed``. Megatron skips even that and calls torch.distributed
directly. minitron shows both: _initialize_distributed creates the world through this layer (as
Megatron-DeepSpeed does), DeepSpeed's runtime (minitron/runtime/) makes every collective call
through the module-level functions at the end of this file, and parallel_state and the layers
call torch.distributed as Megatron's do.

init_distributed's decision list, in order:
1. no cdb yet, but torch.distributed already initialised by the user -> wrap it, done;
2. otherwise, if the torchrun variables are missing, discover them from Slurm or MPI
   (utils.py reads them; DeepSpeed calls this "MPI discovery"), find rank 0's address when
   the ranks span nodes (with_master_addr, below) and export them;
3. create TorchBackend, which calls torch.distributed.init_process_group.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import replace
from datetime import timedelta

import torch

from minitron.accelerator import get_accelerator, set_accelerator_for_backend
from minitron.comm.torch import TorchBackend
from minitron.comm.utils import TORCHRUN_VARS, WorldInfo, discover_world_info
from minitron.trace import traced
from minitron.utils.comms_logging import comms_logger, timed_op

cdb = None  # the process-wide backend object, as in deepspeed.comm


class DiscoveryError(RuntimeError):
    """The environment does not say enough to start the ranks; the message says what to set."""


def with_master_addr(info: WorldInfo) -> WorldInfo:
    """``info``, with rank 0's address found if discovery could not read it.

    Ranks on several nodes need rank 0's real address, never 127.0.0.1. Under MPI, DeepSpeed's
    mpi_discovery broadcasts it with mpi4py; so do we when mpi4py is there. Else: one line.
    """
    if info.master_addr:
        return info
    addr = _mpi_broadcast_rank0_address() if info.source == "mpi" else None
    if addr:
        return replace(info, master_addr=addr)
    raise DiscoveryError(
        f"{info.world_size} {info.source} ranks on several nodes and no MASTER_ADDR: export "
        "MASTER_ADDR=<rank 0's host> (or install mpi4py to broadcast it, as DeepSpeed does)")


def _mpi_broadcast_rank0_address() -> str | None:
    """Rank 0's first IP address (``hostname -I``, else its resolved name), broadcast to all;
    None without mpi4py, which is optional here as in DeepSpeed (only MPI jobs across nodes that
    set no MASTER_ADDR need it)."""
    try:
        from mpi4py import MPI   # optional, as in DeepSpeed: only MPI jobs without MASTER_ADDR need it
    except ImportError:
        return None
    addr = None
    if MPI.COMM_WORLD.Get_rank() == 0:
        try:
            addr = subprocess.check_output(["hostname", "-I"]).decode().split()[0]
        except (OSError, subprocess.CalledProcessError, IndexError):
            addr = socket.gethostbyname(socket.gethostname())
    return MPI.COMM_WORLD.bcast(addr, root=0)


def export_world_info(info: WorldInfo) -> None:
    """Set the torchrun variables from discovered ones, so env:// initialisation finds them."""
    os.environ.update({
        "RANK": str(info.rank), "WORLD_SIZE": str(info.world_size),
        "LOCAL_RANK": str(info.local_rank), "LOCAL_WORLD_SIZE": str(info.local_world_size),
        "MASTER_ADDR": info.master_addr, "MASTER_PORT": str(info.master_port),
    })


@traced
def init_distributed(dist_backend: str | None = None, auto_mpi_discovery: bool = True,
                     timeout: timedelta = timedelta(minutes=30), init_method: str | None = None,
                     dist_init_required: bool | None = None, rank: int = -1, world_size: int = -1):
    """Make sure torch.distributed is initialised and ``cdb`` wraps it."""
    global cdb
    if dist_init_required is None:
        dist_init_required = cdb is None or not cdb.is_initialized()
    if cdb is None and torch.distributed.is_initialized():
        set_accelerator_for_backend(dist_backend or torch.distributed.get_backend())
        cdb = TorchBackend(dist_backend, timeout, init_method)  # user did it already: just wrap
        return cdb
    if not dist_init_required:
        if cdb is None or not cdb.is_initialized():
            raise RuntimeError("dist_init_required=False but torch.distributed is not initialised")
        return cdb
    if auto_mpi_discovery and not all(v in os.environ for v in TORCHRUN_VARS):
        export_world_info(with_master_addr(discover_world_info()))
    if dist_backend is None:
        dist_backend = get_accelerator().communication_backend_name()
    set_accelerator_for_backend(dist_backend)   # gloo on a GPU machine: its tensors stay on the CPU
    cdb = TorchBackend(dist_backend, timeout, init_method, rank, world_size)
    return cdb


def is_initialized() -> bool:
    return cdb is not None and cdb.is_initialized()


def destroy_process_group(group=None) -> None:
    global cdb
    if cdb is not None:
        cdb.destroy_process_group(group)
        if group is None:
            cdb = None


# --8<-- [start:module-api]
# DeepSpeed's module-level API. Its runtime imports this module as ``dist`` (``from deepspeed
# import comm as dist``) and calls dist.all_reduce(...) where Megatron calls torch.distributed;
# every function below forwards to cdb, and cdb (a TorchBackend) to torch.distributed. DeepSpeed
# wraps each collective in @timed_op for its comms logger; so does _forwards (the logger is
# minitron/utils/comms_logging.py), and within it @traced, so a trace shows comm.comm.all_reduce
# with torch's call inside it (that one records the group and the shapes, so this level records
# nothing of its own).
ReduceOp = torch.distributed.ReduceOp  # DeepSpeed has its own enum, which TorchBackend maps to
                                       # torch's; with torch the only backend, torch's serves


def _cdb():
    if cdb is None:   # DeepSpeed asserts the same: nothing to forward to yet
        raise RuntimeError("minitron.comm has no backend yet: call init_distributed() first "
                           "(initialize() does)")
    return cdb


def _forwards(fn):
    # timed_op outermost, so that a debug log name finds the collective's caller one frame up
    return timed_op(traced(fn, args=lambda *a, **k: {}))


def configure(comms_config: dict) -> None:
    """The comms logger as the ds_config's section asks (DeepSpeedEngine.__init__ calls
    dist.configure(config)); its bandwidths count the world's ranks, as DeepSpeed's do."""
    comms_logger.configure(comms_config)
    comms_logger.world_size, comms_logger.rank = get_world_size(), get_rank()


def log_summary() -> dict:
    """DeepSpeed's table, printed by rank 0 between two barriers (so every rank has logged its
    ops first); the barriers are logged too, as log_summary_barrier. Returns this rank's summary."""
    barrier(log_name="log_summary_barrier")
    summary = comms_logger.log_all(print_log=get_rank() == 0)
    barrier(log_name="log_summary_barrier")
    return summary


def get_rank(group=None) -> int:
    return _cdb().get_rank(group)


def get_world_size(group=None) -> int:
    return _cdb().get_world_size(group)


def get_global_rank(group=None, group_rank: int = 0) -> int:
    """The world rank of ``group``'s member number ``group_rank``."""
    return _cdb().get_global_rank(group, group_rank)


def get_world_group():
    return _cdb().get_world_group()


@_forwards
def broadcast(tensor, src, group=None, async_op=False):
    return _cdb().broadcast(tensor, src, group, async_op)


@_forwards
def all_reduce(tensor, op=ReduceOp.SUM, group=None, async_op=False):
    return _cdb().all_reduce(tensor, op, group, async_op)


@_forwards
def reduce(tensor, dst, op=ReduceOp.SUM, group=None, async_op=False):
    return _cdb().reduce(tensor, dst, op, group, async_op)


@_forwards
def reduce_scatter_tensor(output_tensor, tensor, op=ReduceOp.SUM, group=None, async_op=False):
    return _cdb().reduce_scatter_tensor(output_tensor, tensor, op, group, async_op)


@_forwards
def all_gather(tensor_list, tensor, group=None, async_op=False):
    """Every rank's ``tensor`` into ``tensor_list`` (one tensor per rank, in rank order)."""
    return _cdb().all_gather(tensor_list, tensor, group, async_op)


@_forwards
def all_gather_into_tensor(output_tensor, tensor, group=None, async_op=False):
    return _cdb().all_gather_into_tensor(output_tensor, tensor, group, async_op)


@_forwards
def all_to_all_single(output, input, group=None, async_op=False):
    """Block k of ``input`` goes to the group's rank k; ``output`` holds the block each sent me."""
    return _cdb().all_to_all_single(output, input, group, async_op)


@_forwards
def barrier(group=None):
    return _cdb().barrier(group)


@_forwards
def send(tensor, dst, group=None, tag=0):
    return _cdb().send(tensor, dst, group, tag)


@_forwards
def recv(tensor, src=None, group=None, tag=0):
    return _cdb().recv(tensor, src, group, tag)


def new_group(ranks, group_desc=None):
    """A group over ``ranks`` (world ranks). Collective: every rank calls it for every group.
    ``group_desc`` is the name the trace gives the group (torch's own argument)."""
    return _cdb().new_group(list(ranks), group_desc)
# --8<-- [end:module-api]
