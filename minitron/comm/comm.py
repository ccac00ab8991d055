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
   (DeepSpeed calls this "MPI discovery") and export them;
3. create TorchBackend, which calls torch.distributed.init_process_group.
"""

from __future__ import annotations

import os
import socket
import subprocess
from dataclasses import dataclass, replace
from datetime import timedelta

import torch

from minitron.accelerator import get_accelerator, set_accelerator_for_backend
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
    master_addr: str | None  # None: not known from the environment (see with_master_addr)
    master_port: int
    source: str  # which launcher's variables these came from


def _first(env, *names, default=None):
    for name in names:
        if name in env:
            return env[name]
    return default


class DiscoveryError(RuntimeError):
    """The environment does not say enough to start the ranks; the message says what to set."""


def discover_world_info(env=None) -> WorldInfo:
    """Who am I and how many are we? Read torchrun's variables, else Slurm's, else MPI's.

    torchrun (and minitron's launcher) set RANK/WORLD_SIZE/LOCAL_RANK directly. srun sets
    SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID; Open MPI sets OMPI_COMM_WORLD_*; MPICH and Intel
    MPI set PMI_RANK/PMI_SIZE. A bare ``python`` run is rank 0 of a world of 1.
    """
    env = os.environ if env is None else env
    if "RANK" in env and "WORLD_SIZE" in env:
        source, rank, world = "torchrun", env["RANK"], env["WORLD_SIZE"]
        local = env.get("LOCAL_RANK", "0")  # Megatron's default when LOCAL_RANK is missing
        local_world = env.get("LOCAL_WORLD_SIZE", world)
    elif "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
        source, rank, world = "slurm", env["SLURM_PROCID"], env["SLURM_NTASKS"]
        local = env.get("SLURM_LOCALID", "0")
        local_world = slurm_tasks_on_node(env) or world
    elif "OMPI_COMM_WORLD_RANK" in env or "PMI_RANK" in env:
        source = "mpi"
        rank = _first(env, "OMPI_COMM_WORLD_RANK", "PMI_RANK")
        world = _first(env, "OMPI_COMM_WORLD_SIZE", "PMI_SIZE", default="1")
        local = _first(env, "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", default="0")
        local_world = _first(env, "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS")
    else:
        source, rank, world, local, local_world = "single process", "0", "1", "0", "1"
    addr = env.get("MASTER_ADDR") or _slurm_first_host(env)
    if not addr and local_world is not None and int(local_world) == int(world):
        addr = "127.0.0.1"  # every rank is on this node
    # Otherwise rank 0's address is unknown here (None): with_master_addr settles it.
    port = int(env.get("MASTER_PORT", DEFAULT_PORT))
    local_world = world if local_world is None else local_world
    return WorldInfo(int(rank), int(world), int(local), int(local_world), addr, port, source)


def expand_hostlist(nodes: str) -> list[str]:
    """Slurm's compressed host list, expanded as ``scontrol show hostnames`` does:
    'gpu[03-05,09],login' -> gpu03 gpu04 gpu05 gpu09 login; 'rack[1-2]-node[01-02]' ->
    rack1-node01 rack1-node02 rack2-node01 rack2-node02 (the first bracket varies slowest)."""
    hosts, entry, depth = [], "", 0
    for ch in nodes + ",":
        if ch == "," and depth == 0:
            if entry:
                hosts.extend(_expand_host(entry))
            entry = ""
            continue
        depth += (ch == "[") - (ch == "]")
        entry += ch
    return hosts


def _expand_host(pattern: str) -> list[str]:
    if "[" not in pattern:
        return [pattern]
    prefix, rest = pattern.split("[", 1)
    inside, suffix = rest.split("]", 1)
    names = []
    for part in inside.split(","):
        first, _, last = part.partition("-")
        width = len(first)  # "01-04" keeps its zero padding
        for number in range(int(first), int(last or first) + 1):
            names.extend(prefix + str(number).zfill(width) + tail for tail in _expand_host(suffix))
    return names


def slurm_tasks_on_node(env) -> str | None:
    """Tasks on this node: SLURM_TASKS_PER_NODE ('2(x3),1': 2 on each of the first three nodes,
    1 on the fourth), else SLURM_NTASKS_PER_NODE, read at this node's index SLURM_NODEID."""
    spec = env.get("SLURM_TASKS_PER_NODE") or env.get("SLURM_NTASKS_PER_NODE")
    if not spec:
        return None
    counts = []
    for part in spec.split(","):
        count, _, repeat = part.partition("(x")
        counts += [count] * int(repeat.rstrip(")") or 1)
    return counts[min(int(env.get("SLURM_NODEID", "0")), len(counts) - 1)]


def _slurm_first_host(env) -> str | None:
    """The first host of the Slurm job's node list, where rank 0 runs."""
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    return expand_hostlist(nodes)[0] if nodes else None


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
# wraps each collective in @timed_op for its comms logger; @traced is our seam at the same place,
# so a trace shows comm.comm.all_reduce with torch's call inside it (that one records the group
# and the shapes, so this level records nothing of its own).
ReduceOp = torch.distributed.ReduceOp  # DeepSpeed has its own enum, which TorchBackend maps to
                                       # torch's; with torch the only backend, torch's serves


def _cdb():
    if cdb is None:   # DeepSpeed asserts the same: nothing to forward to yet
        raise RuntimeError("minitron.comm has no backend yet: call init_distributed() first "
                           "(initialize() does)")
    return cdb


def _forwards(fn):
    return traced(fn, args=lambda *a, **k: {})


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
