"""DeepSpeed's shared-memory buffers that its CPU ranks leave behind, removed once the run is over.

DeepSpeed 0.19.8's torch backend, on its CPU accelerator, builds a shared-memory all-reduce
(ops/csrc/cpu/comm/shm.cpp) at every `init_distributed`: each rank creates one
/dev/shm/deepspeed_allreduce_buffer_<...>_<addr>_<port>_<rank> of 69 MB, and no exit path
unlinks it. /dev/shm is memory, so each peer test that starts DeepSpeed ranks kept 140-280 MB
of the machine's RAM after it ended: a day of peer runs held 18 GB here, until builds that
start 16 ranks failed for want of memory.

Removed at the end of the pytest session, never during it: a rank opens its peers' buffers by
name after they are created (it retries while the name is missing), so a buffer unlinked while
its job runs would hang that job. Only buffers made since the session began, and that no live
process still maps (another session's job), are removed.
"""

from __future__ import annotations

from pathlib import Path

SHM = Path("/dev/shm")
PREFIX = "deepspeed_allreduce_buffer_"


def mapped_now() -> set[str]:
    """Every /dev/shm file a live process maps or holds open (ours, or another session's)."""
    held = set()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            held.update(line.split(None, 5)[-1].strip() for line in (proc / "maps").read_text().splitlines()
                        if "/dev/shm/" in line)
        except OSError:   # the process ended meanwhile, or is not ours to read
            continue
    return held


def remove_leftovers(since: float) -> int:
    """Unlink DeepSpeed's buffers made at or after ``since`` (a time.time()) that nothing maps;
    how many."""
    if not SHM.is_dir():
        return 0
    candidates = [p for p in SHM.glob(PREFIX + "*") if _made_at(p) >= since]
    if not candidates:
        return 0
    held, removed = mapped_now(), 0
    for path in candidates:
        if str(path) not in held:
            try:
                path.unlink()
                removed += 1
            except OSError:   # removed by its own job meanwhile
                pass
    return removed


def _made_at(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return float("-inf")
