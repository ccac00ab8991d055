"""Helpers the launcher tests run inside ranks: record who we are, then behave as asked.

Used two ways: imported by tests/test_launcher.py (forked ranks call ``probe``), and run as a
script by a launcher (``python tests/_rank_probe.py OUT_DIR MODE``), so that the spawn path and
the script target are exercised with the same code.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ENV_KEYS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "GROUP_RANK", "PROBE_EXTRA")


def start_time(pid: int) -> str | None:
    """Kernel start time of ``pid`` (field 22 of /proc/PID/stat): tells a reused pid apart."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rfind(")") + 2:].split()[19]


def state(pid: int) -> str | None:
    """'R', 'S', 'Z' (zombie: dead but not reaped) ... or None when the pid is gone."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    return stat[stat.rfind(")") + 2]


def record(out: Path) -> int:
    """Write this rank's env and identity to OUT/rank{R}.json; return the rank."""
    rank = int(os.environ["RANK"])
    out.mkdir(parents=True, exist_ok=True)  # so that OUT existing at all proves a rank ran
    info = {"env": {k: os.environ.get(k) for k in ENV_KEYS}, "pid": os.getpid(), "ppid": os.getppid(),
            "start": start_time(os.getpid())}
    tmp = out / f".rank{rank}.json"
    tmp.write_text(json.dumps(info))
    tmp.rename(out / f"rank{rank}.json")  # atomic: a reader never sees half a file
    return rank


def wait_for_ranks(out: Path, world: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not all((out / f"rank{r}.json").exists() for r in range(world)):
        if time.monotonic() > deadline:
            raise TimeoutError("not every rank started")
        time.sleep(0.01)


def leftovers(out: Path, world: int) -> list[str]:
    """Ranks (by recorded pid + start time) that still exist in any form, zombies included."""
    left = []
    for r in range(world):
        path = out / f"rank{r}.json"
        if path.exists():
            info = json.loads(path.read_text())
            if start_time(info["pid"]) == info["start"]:
                left.append(f"rank {r} pid {info['pid']} state {state(info['pid'])}")
    return left


def start_children(out: Path, rank: int) -> None:
    """Start what a rank may leave behind: a `sleep` subprocess and a daemon multiprocessing
    child; record both in OUT/children{R} as [[pid, start time], ...]."""
    import multiprocessing  # here: only the modes that start children need it
    import subprocess  # likewise

    sleeper = subprocess.Popen(["sleep", "120"])
    daemon = multiprocessing.get_context("fork").Process(target=time.sleep, args=(120,), daemon=True)
    daemon.start()
    (out / f"children{rank}").write_text(json.dumps([[p.pid, start_time(p.pid)] for p in (sleeper, daemon)]))


def surviving_children(out: Path, world: int, wait: float = 5.0) -> list[tuple[int, int]]:
    """(rank, pid) of the children ``start_children`` recorded that still run (a zombie that
    its new parent has not reaped yet counts as gone). Kills them, so none outlives the test."""
    survivors = []
    for r in range(world):
        for pid, started in json.loads((out / f"children{r}").read_text()):
            deadline = time.monotonic() + wait   # orphans are reaped by init, which may lag
            while start_time(pid) == started and state(pid) != "Z" and time.monotonic() < deadline:
                time.sleep(0.05)
            if start_time(pid) == started and state(pid) != "Z":
                survivors.append((r, pid))
                os.kill(pid, 9)
    return survivors


def probe(out: Path, mode: str = "env", culprit: int = 2) -> int:
    """mode: 'env' records and returns; 'raise' / 'kill' make ``culprit`` fail once every rank
    is up while the others sleep; 'sleep' just sleeps (to be interrupted); 'children' starts
    processes of its own (start_children) and returns 0 once every rank is up; 'grandchild'
    starts them too, then ``culprit`` raises: the launcher must reach those processes too."""
    rank = record(out)
    print(f"rank {rank} says hello")
    if mode == "env":
        return 0
    if mode in ("children", "grandchild"):
        start_children(out, rank)
    wait_for_ranks(out, int(os.environ["WORLD_SIZE"]))
    if mode == "children":
        return 0
    if rank == culprit and mode in ("raise", "grandchild"):
        raise ValueError(f"rank {rank} fails on purpose")
    if rank == culprit and mode == "kill":
        os.kill(os.getpid(), 9)
    time.sleep(120)
    (out / f"finished{rank}").touch()  # only reached if nobody stopped us
    return 0


if __name__ == "__main__":
    sys.exit(probe(Path(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "env"))
