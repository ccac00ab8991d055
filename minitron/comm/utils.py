"""Who am I, and how many are we: the world read from the launcher's environment
(DeepSpeed's ``deepspeed/comm/utils.py``, whose ``get_world_rank_from_launcher`` and siblings
read torchrun's and Open MPI's variables; minitron reads Slurm's and MPICH's as well).

Nothing here starts a process or talks to another rank: ``discover_world_info`` only reads a
mapping, so a test or a chapter can hand it any launcher's variables. What to do with the answer
(export it, find rank 0's address across nodes, create the world) is ``init_distributed``'s,
in comm.py.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK")
DEFAULT_PORT = 29500


@dataclass
class WorldInfo:
    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    master_addr: str | None  # None: not known from the environment (comm.py's with_master_addr)
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
    # Otherwise rank 0's address is unknown here (None): comm.py's with_master_addr settles it.
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
