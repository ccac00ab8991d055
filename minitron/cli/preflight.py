"""Checks that run before any process starts: can the run write where it was told to, is the
port free, does the module exist, can this machine hold that many ranks?

Each one exists because the same mistake used to surface late and loud: a traceback from
every rank, or (for ``--save``) a whole training run lost at its first save. A check here
costs microseconds and turns that into one line. Every function raises UserError with a
message that says what is wrong and what would fix it; none starts a process or imports torch.
"""

from __future__ import annotations

import errno
import importlib.util
import os
import resource
import socket
import tempfile
from pathlib import Path

from minitron.cli.common import UserError

# --- sizes ---------------------------------------------------------------------------------
# `groups` builds every group as Python lists of ints, so its cost grows like world x kinds; it
# prints the first dozen groups of each kind (--json: all of them, --rank N: one rank's, from its
# digits). Measured on the 2-core machine at 131,072 ranks: 0.5 s of CPU and 140 MB to print,
# 0.6 s and 160 MB for the 12 MB of --json; 10^8 ate gigabytes. 131,072 is the largest world a
# trace may claim (trace/schema.py MAX_WORLD), above the largest published Megatron runs.
GROUPS_MAX_WORLD = 131072
# fake plays the ranks one after another (a worker per core), and each rank builds every group,
# so the cost grows with the square of the world. Measured (CPU time, peak memory): 1,024
# ranks ~10 s; 2,048 ranks 48 s, 1.2 GB; 4,096 ranks 162 s, 3.6 GB. Past 2,048 a layout is
# better studied with `groups`, which shows the same groups at once.
FAKE_MAX_WORLD = 2048
# --ranks plays only the chosen ranks. Each still walks every group of the world, as Megatron's
# initialize_model_parallel does: ~0.25 s of CPU a rank at 131,072 (tp 8, pp 16, cp 2, ep 8),
# so the cost is ranks played x world, and the budget is the whole play's at FAKE_MAX_WORLD.
# The world stops at the most a trace may claim (trace/schema.py MAX_WORLD).
FAKE_RANKS_MAX_WORLD = 131072
FAKE_MAX_RANKS_X_WORLD = FAKE_MAX_WORLD * FAKE_MAX_WORLD
# A forked gloo rank that has joined a group holds 4 threads and ~5 MB of private memory (it
# shares the parent's torch); a training rank holds its model and optimizer on top. The limits:
RANKS_PER_CORE = 32      # 64 ranks on 2 (busy) cores: initialised in 27 s, 47 s in all; twice that, minutes
THREADS_PER_RANK = 8     # 4 measured, doubled: data-loader and debugger threads come on top
MIB_PER_RANK = 64        # what one small rank can be expected to touch, at the least
# `estimate` gives every rank a row (JSON: an object each): 16,384 ranks in 1.1 s, 131,072 in
# 4.4 s and 190 MB, 10^6 in 14 s and 1.3 GB (2 cores). The largest clusters trained on so far
# are well under 131,072 accelerators.
ESTIMATE_MAX_WORLD = 131072
# Each preprocess worker holds a tokenizer and a slice of the corpus; beyond a few per core
# they only wait for the CPU (100,000 workers forked 3,062 processes and 12 GB before failing).
WORKERS_PER_CORE = 4


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def _available_mib() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) // 1024
    except OSError:
        pass
    return None


def gloo_world_limit() -> tuple[int, str]:
    """The most gloo ranks this machine can hold, and which resource set it."""
    cores = _cores()
    limits = [(cores * RANKS_PER_CORE, f"{RANKS_PER_CORE} ranks per core x {cores} cores")]
    mib = _available_mib()
    if mib is not None:
        limits.append((mib // MIB_PER_RANK, f"{mib} MiB available / {MIB_PER_RANK} MiB per rank"))
    soft, _ = resource.getrlimit(resource.RLIMIT_NPROC)
    if soft != resource.RLIM_INFINITY and os.geteuid() != 0:  # the kernel does not apply it to root
        limits.append((soft // THREADS_PER_RANK, f"RLIMIT_NPROC {soft} / {THREADS_PER_RANK} threads per rank"))
    return min(limits)


def check_world_limit(world: int, backend: str, played: int | None = None) -> None:
    """Refuse a world this machine (or this command) cannot hold, naming the limit. ``played``:
    how many ranks of a fake world `trace --ranks` plays (None: all of them)."""
    if backend == "fake" and played is not None:
        return _check_fake_ranks(world, played)
    if backend == "groups":
        limit, why = GROUPS_MAX_WORLD, "beyond it the tables take minutes and gigabytes to print"
    elif backend == "fake":
        limit, why = FAKE_MAX_WORLD, "each rank builds every group, so the cost grows as world squared"
    elif backend == "gloo":
        limit, why = gloo_world_limit()
    elif backend == "estimate":
        limit, why = ESTIMATE_MAX_WORLD, "every rank gets a row, worked out and printed"
    else:
        return  # nccl: one rank per GPU, checked against the GPUs (common.check_backend)
    if world > limit:
        fix = {"groups": "the groups repeat with the same pattern at any size: study a smaller world",
               "estimate": "ranks of one pipeline stage and optimizer shard cost the same: estimate a smaller "
                           "data-parallel size",
               "fake": f"play a few of its ranks with --ranks (worlds up to {FAKE_RANKS_MAX_WORLD}), or see the "
                       "layout with `minitron groups`"}.get(backend, "use `minitron groups` to see a layout that large")
        raise UserError(f"--world {world} is more than {backend} can {'run' if backend in ('gloo', 'fake') else 'show'} "
                        f"here: at most {limit} ({why}); {fix}")


def _check_fake_ranks(world: int, played: int) -> None:
    if world > FAKE_RANKS_MAX_WORLD:
        raise UserError(f"--world {world} is more than fake can play here, even a few ranks of it: at most "
                        f"{FAKE_RANKS_MAX_WORLD} (the largest world a trace may claim); study a smaller world")
    most = max(FAKE_MAX_RANKS_X_WORLD // world, 1)
    if played > most:
        raise UserError(f"--ranks names {played} ranks of a {world}-rank world: fake plays at most {most} here "
                        f"(each walks every group of the world: ranks x world <= {FAKE_MAX_WORLD}²); "
                        f"choose fewer ranks")


def parse_ranks(spec: str, world: int) -> list[int]:
    """``--ranks 0,12345,131071`` or ``0-3`` (or both, mixed): the ranks, ascending. Each must be
    inside the world and named once; a range is checked before it is counted out, so that
    ``0-10**12`` is refused, not built."""
    example = "give ranks and ranges like 0,12345,131071 or 0-3"
    parts = [p.strip() for p in spec.split(",")]
    if not any(parts):
        raise UserError(f"--ranks {spec!r} names no rank; {example}")
    chosen: list[int] = []
    for part in parts:
        first, dash, last = part.partition("-")
        if not (first.isdigit() and (not dash or last.isdigit())):
            raise UserError(f"--ranks {spec!r}: {part!r} is not a rank or a range; {example}")
        lo, hi = int(first), int(last) if dash else int(first)
        if lo > hi:
            raise UserError(f"--ranks {spec!r}: {part} runs backwards; write it {hi}-{lo}")
        if hi >= world:
            raise UserError(f"--ranks {spec!r}: rank {hi} is outside the world of {world} ranks; choose 0..{world - 1}")
        chosen.extend(range(lo, hi + 1))
        if len(chosen) > FAKE_MAX_RANKS_X_WORLD:  # an absurd list: refuse before it grows further
            break
    seen: set[int] = set()
    for rank in chosen:
        if rank in seen:
            raise UserError(f"--ranks {spec!r} names rank {rank} twice; name each rank once")
        seen.add(rank)
    return sorted(chosen)


def check_workers(workers: int) -> None:
    limit = _cores() * WORKERS_PER_CORE
    if not 1 <= workers <= limit:
        raise UserError(f"--workers {workers}: give 1..{limit} ({WORKERS_PER_CORE} per core x {_cores()} "
                        f"cores; more only wait for the CPU and each holds its own memory)")


def check_data_workers(workers: int, world: int) -> None:
    """--num-workers: every rank forks that many DataLoader workers, all on this machine's cores."""
    limit = _cores() * WORKERS_PER_CORE // world
    if workers > limit:
        raise UserError(f"--num-workers {workers:,}: {world} rank(s) x {workers:,} DataLoader workers on {_cores()} cores; "
                        f"give at most {limit} ({WORKERS_PER_CORE} workers per core, shared by the ranks; more only "
                        f"wait for the CPU and each holds its own memory)")


# --- places --------------------------------------------------------------------------------
def check_output_dir(path, flag: str) -> None:
    """``path`` is, or can become, a directory we can write into. Nothing is created: the
    nearest existing ancestor must be a directory in which a file can really be made (a
    probe, not os.access, which says yes to root on a read-only file system)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise UserError(f"{flag} {path} is an existing file, not a directory: give a directory path")
    probe_in = path
    while not probe_in.exists():
        if probe_in.parent == probe_in:
            break
        probe_in = probe_in.parent
    if not probe_in.is_dir():
        raise UserError(f"{flag} {path}: {probe_in} is a file, so no directory can be made under it")
    _probe(probe_in, f"{flag} {path}")


def check_output_file(path, flag: str) -> None:
    """``path`` is a file we may (over)write: not a directory, in a writable directory."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"{flag} {path} is a directory: give the file's path")
    if path.exists() and not os.access(path, os.W_OK):
        raise UserError(f"{flag} {path} is not writable: change its permissions or give another path")
    parent = path.parent
    while not parent.exists() and parent.parent != parent:
        parent = parent.parent
    if not parent.is_dir():
        raise UserError(f"{flag} {path}: {parent} is a file, so no directory can be made under it")
    _probe(parent, f"{flag} {path}")


def _probe(directory: Path, what: str) -> None:
    try:
        fd, name = tempfile.mkstemp(prefix=".minitron-probe-", dir=directory)
    except OSError as exc:
        raise UserError(f"{what}: cannot write into {directory} ({exc.strerror}): "
                        f"give a writable location") from None
    os.close(fd)
    os.unlink(name)


# --- the network and the program -----------------------------------------------------------
def check_master_port(port: int | None, host: str = "127.0.0.1") -> None:
    """A port in range and free on the master address now (None: the launcher picks one)."""
    if port is None:
        return
    if not 1 <= port <= 65535:
        raise UserError(f"--master-port {port} is not a TCP port: give 1..65535, or leave it out for a free one")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the store does: TIME_WAIT is free
        try:
            s.bind((host, port))
        except OSError as exc:
            why = "in use" if exc.errno == errno.EADDRINUSE else exc.strerror
            raise UserError(f"--master-port {port} on {host}: {why}; choose another, or leave it out "
                            f"for a free one") from None


def check_module(name: str) -> None:
    """``launch -m NAME``: the module exists, found the way ``python -m`` will find it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError) as exc:  # a parent package that is missing or broken
        raise UserError(f"-m {name}: cannot find it ({exc}); check the name and PYTHONPATH") from None
    if spec is None:
        raise UserError(f"-m {name}: no such module on this Python's path; check the name and PYTHONPATH")


def check_launch(world: int, backend: str, master_port: int | None = None, places: dict | None = None,
                 played: int | None = None) -> None:
    """What every command that starts ranks checks last, before the first fork: the world
    fits the machine, the port is free, and each output place (flag -> path) is writable."""
    check_world_limit(world, backend, played)
    if backend != "fake":
        check_master_port(master_port)
    for flag, path in (places or {}).items():
        if path is not None:
            check_output_dir(path, flag)
