"""DeepSpeed-style communication front end: init_distributed and the backend object ``cdb``.

DeepSpeed does not talk to NCCL itself. ``deepspeed.comm`` keeps one module-level object,
``cdb`` ("communication data backend"), and that object is a TorchBackend: a thin class whose
methods call ``torch.distributed``. Megatron skips even that and calls torch.distributed
directly. minitron's _initialize_distributed goes through this layer (as Megatron-DeepSpeed
does) so a reader can see both: the cdb indirection here, and plain torch.distributed calls
everywhere in parallel_state and the layers.

init_distributed's decision list, in order:
1. no cdb yet, but torch.distributed already initialised by the user -> wrap it, done;
2. otherwise, if the torchrun variables are missing, discover them from Slurm or MPI
   (DeepSpeed calls this "MPI discovery") and export them;
3. create TorchBackend, which calls torch.distributed.init_process_group.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch

from minitron.accelerator import get_accelerator
from minitron.comm.torch import TorchBackend
from minitron.trace import traced

cdb = None  # the process-wide backend object, as in deepspeed.comm

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
DEFAULT_PORT = 29500


@dataclass
class WorldInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str
    master_port: int
    source: str  # which launcher's variables these came from


def _first(env, *names, default=None):
    for name in names:
        if name in env:
            return env[name]
    return default


def discover_world_info(env=None) -> WorldInfo:
    """Who am I and how many are we? Read torchrun's variables, else Slurm's, else MPI's.

    torchrun (and minitron's launcher) set RANK/WORLD_SIZE/LOCAL_RANK directly. srun sets
    SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; Open MPI sets OMPI_COMM_WORLD_*; MPICH and Intel
    MPI set PMI_RANK/PMI_SIZE. A bare ``python`` run is rank 0 of a world of 1.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        source, rank, world = "torchrun", env["RANK"], env["WORLD_SIZE"]
        local = env.get("LOCAL_RANK", rank)
        local_world = env.get("LOCAL_WORLD_SIZE", world)
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        source, rank, world = "slurm", env["SLURM_PROCID"], env["SLURM_NTASKS"]
        local = env.get("SLURM_LOCALID", "0")
        local_world = env.get("SLURM_NTASKS_PER_NODE", world).split("(")[0]
    elif "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        source = "mpi"
        rank = _first(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK")
        world = _first(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", default="1")
        local = _first(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", default="0")
        local_world = _first(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", default=world)
    else:
        source, rank, world, local, local_world = "single process", "0", "1", "0", "1"
    addr = env.get("MASTER_ADDR") or _slurm_first_host(env) or "127.0.0.1"
    port = int(env.get("MASTER_PORT", DEFAULT_PORT))
    return WorldInfo(int(rank), int(world), int(local), int(local_world), addr, port, source)


def _slurm_first_host(env) -> str | None:
    """The first host of a Slurm node list: 'gpu[03-05,09]' -> 'gpu03'."""
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodes:
        return None
    head = nodes.split(",")[0]
    if "[" in head:
        prefix, rest = head.split("[", 1)
        return prefix + rest.split("-")[0].rstrip("]")
    return head


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
        cdb = TorchBackend(dist_backend, timeout, init_method)  # user did it already: just wrap
        return cdb
    if not dist_init_required:
        if cdb is None or not cdb.is_initialized():
            raise RuntimeError("dist_init_required=False but torch.distributed is not initialised")
        return cdb
    if auto_mpi_discovery and not all(v in os.environ for v in TORCHRUN_VARS):
        export_world_info(discover_world_info())
    if dist_backend is None:
        dist_backend = get_accelerator().communication_backend_name()
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


# DeepSpeed's module-level API: deepspeed.comm.all_reduce(...) forwards to cdb.
def get_rank(group=None) -> int:
    return cdb.get_rank(group)


def get_world_size(group=None) -> int:
    return cdb.get_world_size(group)


def all_reduce(tensor, op=torch.distributed.ReduceOp.SUM, group=None, async_op=False):
    return cdb.all_reduce(tensor, op, group, async_op)


def broadcast(tensor, src, group=None, async_op=False):
    return cdb.broadcast(tensor, src, group, async_op)


def barrier(group=None):
    return cdb.barrier(group)


def new_group(ranks, group_desc=None):
    return cdb.new_group(ranks, group_desc)
