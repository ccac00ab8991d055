"""DeepSpeed's runner, the arithmetic part: from a hostfile and --include/--exclude to the
world_info every node's launch.py receives, and from world_info to each rank's environment.

DeepSpeed starts a job in two hops. ``deepspeed`` (runner.py) runs once: it reads the hostfile
(``worker-0 slots=4`` per line), filters it with --include/--exclude/--num_nodes/--num_gpus into
the *active resources* ``{host: [slot, ...]}``, encodes that dict as base64 JSON (world_info) and
starts ``deepspeed.launcher.launch`` on every host (via pdsh on several hosts). Each launch.py
decodes world_info, finds its own host by --node_rank, and starts one process per slot with RANK,
LOCAL_RANK, WORLD_SIZE, CROSS_RANK (the node's index), CROSS_SIZE (the number of nodes), LOCAL_SIZE
and the device list. Everything here is pure functions of those inputs, so ``minitron launch
--dry-run`` can show all of it on one laptop; minitron itself runs one host's share (localhost),
and several hosts under torchrun.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import sys
from collections import OrderedDict
from pathlib import Path


class ResourceError(ValueError):
    """A bad hostfile or filter; the message is one line."""


# Every slot becomes a list entry (and, on a dry run, a row), so a typo such as slots=1000000000
# would take gigabytes before anything else could object. No node carries more accelerators
# than this (DeepSpeed sets no bound, and builds the same lists).
MAX_SLOTS_PER_HOST = 4096
MAX_HOSTFILE_BYTES = 16 << 20   # ~40 bytes a host: room for 400,000 hosts and their comments
# Linux is built for at most 8192 CPUs (NR_CPUS): a longer core list cannot be a machine's.
MAX_CORES = 8192


def check_slot_count(host: str, slots: int, source: str) -> None:
    if slots > MAX_SLOTS_PER_HOST:
        raise ResourceError(f"{source}: {host} with more than {MAX_SLOTS_PER_HOST} slots; a host has at most "
                            f"{MAX_SLOTS_PER_HOST} (one per accelerator): give its device count")


def fetch_hostfile(path: str | Path) -> "OrderedDict[str, int] | None":
    """``{host: slots}`` from DeepSpeed's hostfile format; None when there is no such file (DeepSpeed
    then warns and uses the local machine only)."""
    path = Path(path)
    if not path.is_file():
        return None
    if path.stat().st_size > MAX_HOSTFILE_BYTES:  # read whole below: an 8 GB file would be 8 GB here
        raise ResourceError(f"{path}: {path.stat().st_size >> 20} MiB is no hostfile (one 'HOST slots=N' line "
                            f"per host; at most {MAX_HOSTFILE_BYTES >> 20} MiB read)")
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise ResourceError(f"{path}: not UTF-8 text (byte {exc.start})") from None
    try:
        return _parse_hostfile(lines)
    except ResourceError as exc:
        raise ResourceError(f"{path}: {exc}") from None


def _parse_hostfile(lines: list[str]) -> "OrderedDict[str, int]":
    pool: OrderedDict[str, int] = OrderedDict()
    for line in (raw.strip() for raw in lines):
        if not line or line.startswith("#"):
            continue
        match = re.search(r"^(\S+)\s+slots=(\d+)", line)
        if not match:
            raise ResourceError(f"bad entry {line!r}: each line is 'HOST slots=N'")
        host = match.group(1)
        if host in pool:
            raise ResourceError(f"{host} appears twice; give each host one line")
        digits = match.group(2)
        pool[host] = int(digits) if len(digits) <= 9 else MAX_SLOTS_PER_HOST + 1  # no 5,000-digit int()
        check_slot_count(host, pool[host], f"{line[:60]!r}")
    if not pool:
        raise ResourceError("no hosts: the hostfile is empty or has only comments")
    return pool


def parse_node_config_list(spec: str) -> dict[str, list[int]]:
    """``"worker-0@worker-1:0,2"`` -> ``{"worker-0": [], "worker-1": [0, 2]}`` (no slots: all of them)."""
    nodes: dict[str, list[int]] = {}
    for node in spec.split("@"):
        host, colon, slots = node.partition(":")
        if colon and not slots:   # DeepSpeed fails here too: int('') of the empty slot list
            raise ResourceError(f"{node!r}: no slots after ':'; name them, as in {host}:0,1, or drop the ':' "
                                "for all of the host's slots")
        try:
            ids = [int(s) for s in slots.split(",")] if slots else []
        except ValueError:
            raise ResourceError(f"{node!r}: slots are numbers, as in host:0,1") from None
        nodes[host] = sorted(set(nodes.get(host, []) + ids))
    return nodes


def parse_resource_filter(host_info: "OrderedDict[str, list[int]]", include: str = "", exclude: str = ""):
    """Keep (--include) or drop (--exclude) hosts and slots, keeping the hostfile's host order: the
    order decides which ranks each host gets."""
    if include and exclude:
        raise ResourceError("--include and --exclude are mutually exclusive; use one")
    if not include and not exclude:
        return host_info
    chosen = {} if include else {h: list(s) for h, s in host_info.items()}
    for host, slots in parse_node_config_list(include or exclude).items():
        if host not in host_info:
            raise ResourceError(f"host {host!r} is not in the hostfile ({', '.join(host_info)})")
        for slot in slots:
            if slot not in host_info[host]:
                raise ResourceError(f"host {host!r} has no slot {slot} (it has {host_info[host]})")
        if include:
            chosen[host] = slots or list(host_info[host])
        else:
            chosen[host] = [s for s in chosen[host] if s not in slots] if slots else []
    # DeepSpeed removes duplicate slots keeping their order, then hosts left with no slot.
    return OrderedDict((h, list(dict.fromkeys(chosen[h]))) for h in host_info if chosen.get(h))


def parse_inclusion_exclusion(resource_pool: "OrderedDict[str, int]", include: str, exclude: str):
    """Every host's slots as a list (the hostfile's count), then filtered: a host named without
    slots (``--include worker-0``) keeps all of them, and a slot the host lacks is refused.

    DeepSpeed 0.19.8 does the same. Older code (its commit 38327e0, say) seeded the lists from the
    --include itself, which dropped a whole-host include and let ``worker-1:5`` pass on a 2-slot host.
    An --exclude can leave nothing: the result is then empty, as DeepSpeed's is, and the caller
    (active_resources) refuses it.
    """
    active = OrderedDict((host, list(range(slots))) for host, slots in resource_pool.items())
    return parse_resource_filter(active, include, exclude)


def active_resources(hostfile: str | Path | None, local_slots: int, include: str = "", exclude: str = "",
                     num_nodes: int = -1, num_gpus: int = -1) -> "OrderedDict[str, list[int]]":
    """What runner.main computes before encoding world_info. Without a hostfile the pool is this
    machine alone: ``localhost`` with ``local_slots`` slots (DeepSpeed: its GPU count)."""
    if (num_nodes >= 0 or num_gpus >= 0) and (include or exclude):
        raise ResourceError("--num_nodes/--num_gpus cannot be combined with --include/--exclude")
    pool = fetch_hostfile(hostfile) if hostfile else None
    if pool is None:
        if num_nodes > 1:
            raise ResourceError(f"--num_nodes {num_nodes} needs a hostfile naming that many hosts (--hostfile)")
        check_slot_count("localhost", local_slots, "--world")
        pool = OrderedDict(localhost=local_slots)
    if num_gpus > 0:
        check_slot_count("each host", num_gpus, "--num_gpus")
    active = parse_inclusion_exclusion(pool, include, exclude)
    if num_nodes > 0:
        active = OrderedDict(list(active.items())[:num_nodes])
    if num_gpus > 0:
        active = OrderedDict((host, list(range(num_gpus))) for host in active)
    if not active:
        # DeepSpeed 0.19.8 hands the empty world on, and fails later with an IndexError: in the
        # ssh check or master-address lookup of its first host, or in launch.py's own-node lookup.
        raise ResourceError("--include/--exclude left no slot to run on (DeepSpeed would fail on the empty "
                            "world with an IndexError); exclude fewer")
    return active


def encode_world_info(world_info: dict) -> str:
    return base64.urlsafe_b64encode(json.dumps(world_info).encode("utf-8")).decode("utf-8")


def decode_world_info(encoded: str) -> "OrderedDict[str, list[int]]":
    """launch.py's --world_info: base64 of ``{"host": [slot, ...], ...}``, checked as a schema
    (launch.py indexes it as one and fails deep inside with an IndexError or a TypeError)."""
    try:
        info = json.loads(base64.urlsafe_b64decode(encoded), object_pairs_hook=OrderedDict)
    except (ValueError, UnicodeDecodeError, RecursionError):
        raise ResourceError(f"--world_info {encoded[:20]}...: not a base64-encoded world_info") from None
    shape = 'a JSON object {"HOST": [SLOT, ...]} in base64'
    if not isinstance(info, dict) or not info:
        raise ResourceError(f"--world_info decodes to {json.dumps(info)[:40]}, not {shape}")
    for host, slots in info.items():
        if not host.strip():
            raise ResourceError(f"--world_info: a host with an empty name; it should be {shape}")
        if not isinstance(slots, list) or not slots:
            raise ResourceError(f"--world_info: host {host!r} has {json.dumps(slots)[:40]}, not a list of slot "
                                f"numbers such as [0, 1]")
        check_slot_count(host, len(slots), "--world_info")
        for slot in slots:
            if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < MAX_SLOTS_PER_HOST:
                raise ResourceError(f"--world_info: host {host!r} lists slot {json.dumps(slot)[:40]}; a slot is a "
                                    f"device number from 0 to {MAX_SLOTS_PER_HOST - 1}")
        if len(set(slots)) != len(slots):
            raise ResourceError(f"--world_info: host {host!r} lists a slot twice ({slots[:8]}); each device "
                                "takes one rank")
    return info


def node_rank_env(world_info: dict, node_rank: int, master_addr: str, master_port: int) -> list[dict]:
    """What launch.py sets for each process of host number ``node_rank``: global ranks count up
    host by host in world_info's order. LOCAL_RANK is DeepSpeed's ``rank % processes on this
    host`` — the process's index on its host only when every host before it has the same count."""
    hosts = list(world_info)
    if not 0 <= node_rank < len(hosts):
        raise ResourceError(f"--node_rank {node_rank}: world_info has hosts 0..{len(hosts) - 1}")
    first = sum(len(world_info[h]) for h in hosts[:node_rank])
    slots = world_info[hosts[node_rank]]
    world = sum(len(s) for s in world_info.values())
    return [{"RANK": str(first + i), "LOCAL_RANK": str((first + i) % len(slots)), "WORLD_SIZE": str(world),
             "CROSS_RANK": str(node_rank), "CROSS_SIZE": str(len(hosts)), "LOCAL_SIZE": str(len(slots)),
             "CUDA_VISIBLE_DEVICES": ",".join(map(str, slots)), "MASTER_ADDR": master_addr,
             "MASTER_PORT": str(master_port)} for i in range(len(slots))]


def node_command(world_info: dict, master_addr: str, master_port: int, program: list[str],
                 launch_flags: list[str] = ()) -> list[str]:
    """The command DeepSpeed's runner runs, as shell-quoted pieces (join them with spaces): launch.py
    directly on one host; on several, one pdsh line that starts it on every host with ``%n``
    (pdsh's index of the host) as --node_rank."""
    launch = shlex.join(["python", "-u", "-m", "deepspeed.launcher.launch"])
    where = shlex.join([f"--master_addr={master_addr}", f"--master_port={master_port}"])
    pieces = [launch, shlex.quote(f"--world_info={encode_world_info(world_info)}")]
    if len(world_info) > 1:
        pieces = [shlex.join(["pdsh", "-S", "-f", "1024", "-w", ",".join(world_info)])] + pieces
        where = "--node_rank=%n " + where
    return pieces + [where] + ([shlex.join(launch_flags)] if launch_flags else []) + [shlex.join(program)]


# --- launch.py's options for each process: --bind_cores_to_rank, --save_pid, --no_python -------

BIND_CORE_LIST_ENV = "MINITRON_BIND_CORE_LIST"  # the launcher's core list; each rank takes its share
PID_FILE_BASEPATH = "/tmp"                        # DeepSpeed's launch.py: /tmp/<runner pid>.deepspeed


def parse_range_list(text: str) -> list[int]:
    """``--bind_core_list 1,3-5,7`` -> ``[1, 3, 4, 5, 7]``. DeepSpeed's rule: each piece a number
    or LOW-HIGH, the pieces ascending and not overlapping."""
    cores: list[int] = []
    for piece in text.split(","):
        low, dash, high = piece.partition("-")
        try:
            first, last = int(low), int(high if dash else low)
        except ValueError:
            raise ResourceError(f"--bind_core_list {text}: {piece!r} is not a core number or a range "
                                "LOW-HIGH (e.g. 0-3,8)") from None
        if first > last or first < 0 or (cores and first <= cores[-1]):
            raise ResourceError(f"--bind_core_list {text}: the ranges must be ascending and not overlap "
                                f"({piece!r})")
        if len(cores) + last - first + 1 > MAX_CORES:  # before the list is built: 0-1000000000 is 8 GB
            raise ResourceError(f"--bind_core_list {text[:40]}: {piece!r} names more cores than a machine can have "
                                f"(Linux is built for at most {MAX_CORES} CPUs)")
        cores.extend(range(first, last + 1))
    return cores


def cores_for_rank(core_list: list[int], num_local_procs: int, local_rank: int) -> list[int]:
    """DeepSpeed's split (``get_numactl_cmd``): every local rank gets len // n consecutive cores
    of the list, in local-rank order; what does not divide stays idle."""
    per_rank = len(core_list) // num_local_procs
    if per_rank < 1:
        raise ResourceError(f"--bind_cores_to_rank: {len(core_list)} cores for {num_local_procs} ranks on "
                            "this host; each rank needs one at least: start fewer ranks")
    return list(core_list[per_rank * local_rank:per_rank * (local_rank + 1)])


def bind_cores_from_env() -> list[int] | None:
    """In a rank: pin this process to its share of the launcher's core list (None when the
    launcher was not asked to). DeepSpeed starts the rank under ``numactl -C CORES`` (and sets
    OMP_NUM_THREADS to their number); sched_setaffinity is the system call numactl makes,
    without the package. Threads the rank starts later (torch's pool) inherit the mask."""
    listed = os.environ.get(BIND_CORE_LIST_ENV)
    if not listed:
        return None
    cores = cores_for_rank(parse_range_list(listed), int(os.environ["LOCAL_SIZE"]), int(os.environ["LOCAL_RANK"]))
    os.sched_setaffinity(0, cores)
    return cores


def exec_program(program: list[str], local_rank_arg: bool) -> None:
    """``--no_python``: this forked rank *becomes* the program (exec), keeping the environment
    the launcher gave it; launch.py's ``--local_rank=N`` comes first among its arguments, as there."""
    argv = [program[0], *([f"--local_rank={os.environ['LOCAL_RANK']}"] if local_rank_arg else []), *program[1:]]
    sys.stdout.flush()
    sys.stderr.flush()
    os.execvp(argv[0], argv)
