"""Where a traced rank is, written on request: ``kill -USR2 PID`` (the launcher's hang watch
sends it to every rank when the job stops moving).

A rank that hangs is blocked inside torch's C++ (a gloo or NCCL wait), where a Python signal
handler never runs: Python runs handlers in the main thread, between bytecodes. So the signal is
only a doorbell. ``signal.set_wakeup_fd`` makes the C-level handler write the signal's number
into a pipe at once, and a thread of ours, asleep on that pipe, wakes and writes three things
while the main thread stays where it is (a blocked collective has released the GIL):

* the open records of the calls the rank is inside (recorder.write_open), flushed, so the trace
  says which traced call it is in even when that call is a compute step, not a collective;
* ``rank{R}.where.json``: the main thread's Python stack (sys._current_frames), innermost last;
  written last, through a rename, so the watch knows the dump is complete when it appears;
* with PyTorch's Flight Recorder on (launcher/hang_watch.py sets it up), its buffer, as
  ``flight_recorder/fr_rank{R}``: the file name and pickle torch's own analyser reads.

Costs nothing until asked: one sleeping thread. A program that sets its own wakeup fd (asyncio
does) takes the doorbell away; the watch then reports the rank as not answering.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
import traceback
from pathlib import Path

DUMP_SIGNAL = signal.SIGUSR2
WHERE_SUFFIX = ".where.json"
FR_DIR, FR_PREFIX = "flight_recorder", "fr_rank"
# Set by the launcher when it turned PyTorch's Flight Recorder on: which dump function to call.
FR_ENV = "MINITRON_FLIGHT_RECORDER"


def where_file(trace_dir, rank: int) -> Path:
    return Path(trace_dir) / f"rank{rank}{WHERE_SUFFIX}"


# What the doorbell thread serves: this process's current recorder and trace directory. One
# thread per process, however many sessions it runs in turn (a pid: a forked child starts over).
_serving: dict = {}


def install(recorder, trace_dir) -> None:
    """Answer DUMP_SIGNAL for ``recorder``'s rank from now on. From the main thread only (Python
    lets no other set a signal handler); elsewhere the rank simply has no doorbell."""
    for stale in (where_file(trace_dir, recorder.rank), Path(trace_dir) / FR_DIR / f"{FR_PREFIX}{recorder.rank}"):
        stale.unlink(missing_ok=True)   # an earlier run's answer is not this one's
    if threading.current_thread() is not threading.main_thread():
        return
    fresh = _serving.get("pid") != os.getpid()
    _serving.update(pid=os.getpid(), recorder=recorder, trace_dir=Path(trace_dir))
    if not fresh:
        return
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)   # the C handler must never block on a full pipe
    signal.signal(DUMP_SIGNAL, lambda signum, frame: None)   # a Python handler: the doorbell rings only for those
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    threading.Thread(target=_serve, args=(read_end, threading.main_thread().ident),
                     name="minitron-dump", daemon=True).start()


def _serve(read_end: int, main: int) -> None:
    while True:
        try:
            rung = os.read(read_end, 64)
        except OSError:
            return
        if not rung:
            return
        if DUMP_SIGNAL in rung:
            recorder = _serving["recorder"]
            try:
                dump(recorder, _serving["trace_dir"], main)
            except Exception as exc:   # a dump must never take the rank down
                print(f"minitron: rank {recorder.rank} could not write where it is: {exc}", file=sys.stderr)


def dump(recorder, trace_dir: Path, main: int) -> None:
    if not recorder.closed:
        recorder.write_open()
    try:
        fr = _flight_recorder(recorder.rank, trace_dir)
    except Exception as exc:   # torch's dump failed: the rest of the answer still matters more
        fr = f"not written: {type(exc).__name__}: {exc}"
    frame = sys._current_frames().get(main)
    stack = [[f.filename, f.lineno, f.name] for f in traceback.extract_stack(frame)] if frame else []
    where = {"rank": recorder.rank, "pid": os.getpid(), "time_us": time.time_ns() // 1000, "stack": stack,
             "flight_recorder": fr}
    path = where_file(trace_dir, recorder.rank)
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(where))
    os.replace(partial, path)


def _flight_recorder(rank: int, trace_dir: Path) -> str | None:
    """Write torch's Flight Recorder buffer where its analyser looks; the file's name, or None."""
    which = os.environ.get(FR_ENV)
    if not which:
        return None
    import torch   # loaded: this rank runs torch.distributed

    dump_fn = getattr(torch._C._distributed_c10d, which, None)
    if dump_fn is None:
        return None
    out = trace_dir / FR_DIR / f"{FR_PREFIX}{rank}"
    out.parent.mkdir(exist_ok=True)
    # Without stack traces: torch symbolizes them under the GIL, which a rank blocked in a gloo
    # collective holds until the collective ends (measured: the dump waited for it). The
    # stacks are in where.json anyway, read by this thread.
    out.write_bytes(dump_fn(includeStackTraces=False))
    return str(out.relative_to(trace_dir))
