"""`--hang-timeout SECONDS`: notice that a job stopped moving, ask every rank where it is, stop it.

A traced rank stamps the time into its own 8-byte slot of a small shared file each time one of
its calls ends (recorder.set_progress; one struct.pack_into per call). The launcher reads the
slots as it polls its ranks anyway. When no rank has finished a call for SECONDS, the job is
hung: a collective waits for a rank that will never come, and without this it would wait for
torch's own timeout (30 minutes by default) and then die without saying why.

Then the launcher rings every rank's doorbell (trace/dump.py: DUMP_SIGNAL), waits until each has
written where it is (``rank{R}.where.json``; at most DUMP_WAIT_S), hands the trace directory to
whoever shows the diagnosis (the command line's hang screen), and stops every rank.

PyTorch has its own recorder of collectives, the Flight Recorder: a ring buffer per process of
the last N collectives (sequence number, group, sizes, state: scheduled, started, completed).
Under a watch it is turned on too (``flight_recorder_env``), for nccl with the dump NCCL's own
watchdog writes when a collective times out; the rank's dump thread also writes it on request.
"""

from __future__ import annotations

import mmap
import os
import struct
import time
from pathlib import Path

from minitron.trace.dump import DUMP_SIGNAL, FR_DIR, FR_ENV, FR_PREFIX, where_file

PROGRESS_ENV = "MINITRON_HANG_PROGRESS"
DUMP_WAIT_S = 1.0      # a rank answers within milliseconds; one that does not is reported so
FR_ENTRIES = "2000"    # collectives the Flight Recorder keeps per process


def flight_recorder_env(backend: str, trace_dir: Path) -> dict[str, str]:
    """The variables that turn PyTorch's Flight Recorder on for ``backend``.

    nccl: TORCH_NCCL_TRACE_BUFFER_SIZE (entries kept), TORCH_NCCL_DUMP_ON_TIMEOUT (the watchdog
    writes the buffer when a collective times out) into TORCH_NCCL_DEBUG_INFO_TEMP_FILE + rank.
    gloo: TORCH_FR_BUFFER_SIZE (gloo records into the same kind of buffer; it has no watchdog
    that dumps, so the rank's dump thread does, on request). A variable the user set wins.
    """
    prefix = str(Path(trace_dir).resolve() / FR_DIR / FR_PREFIX)
    if backend == "nccl":
        env = {"TORCH_NCCL_TRACE_BUFFER_SIZE": FR_ENTRIES, "TORCH_NCCL_DUMP_ON_TIMEOUT": "1",
               "TORCH_NCCL_DEBUG_INFO_TEMP_FILE": prefix, FR_ENV: "_dump_nccl_trace"}
    else:
        env = {"TORCH_FR_BUFFER_SIZE": FR_ENTRIES, FR_ENV: "_dump_fr_trace"}
    return {k: v for k, v in env.items() if k not in os.environ}


def watch_progress(recorder) -> None:
    """In a rank: stamp each finished call where the launcher's watch reads it, if one watches."""
    path = os.environ.get(PROGRESS_ENV)
    if not path:
        return
    with open(path, "r+b") as f:
        shared = mmap.mmap(f.fileno(), 0)
    rank = recorder.rank
    if (rank + 1) * 8 <= len(shared):
        struct.pack_into("d", shared, rank * 8, time.time())   # alive: the clock starts now
        recorder.set_progress(shared, rank)


class HangWatch:
    """The launcher's side: the shared slots, and what to do when they stop moving."""

    def __init__(self, world: int, timeout: float, trace_dir: Path, scratch: Path):
        self.world, self.timeout, self.trace_dir = world, timeout, Path(trace_dir)
        path = scratch / "progress"
        path.write_bytes(bytes(8 * world))
        with open(path, "r+b") as f:
            self.shared = mmap.mmap(f.fileno(), 0)
        self.env = {PROGRESS_ENV: str(path)}
        # NCCL's watchdog writes its dumps there on a timeout, and opens no missing folder
        (self.trace_dir / FR_DIR).mkdir(parents=True, exist_ok=True)
        self.started = time.time()

    def last_progress(self) -> float:
        return max(self.started, *struct.unpack_from(f"{self.world}d", self.shared))

    def stalled(self) -> bool:
        return time.time() - self.last_progress() > self.timeout

    def ask_where(self, procs: list) -> list[int]:
        return ask_where(procs, self.trace_dir)

    def close(self) -> None:
        self.shared.close()


def ask_where(procs: list, trace_dir: Path) -> list[int]:
    """Ring every live rank's doorbell and wait for the answers; the ranks that gave none. Also
    when the user stops a traced job (Ctrl-C): `view DIR --hang` then has their stacks too."""
    asked = {}
    for rank, p in enumerate(procs):
        if p.poll() is None:
            try:
                os.kill(p.pid, DUMP_SIGNAL)
                asked[rank] = where_file(trace_dir, rank)
            except ProcessLookupError:
                pass
    deadline = time.monotonic() + DUMP_WAIT_S
    waiting = dict(asked)
    while waiting and time.monotonic() < deadline:
        waiting = {r: f for r, f in waiting.items() if not f.exists()}
        time.sleep(0.01)
    return sorted(waiting)
