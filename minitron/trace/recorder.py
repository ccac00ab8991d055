"""The call-trace recorder: one per process, one JSON line per finished call.

Why a decorator and not sys.setprofile: a global profiler costs 6-8x on this code and fights
debuggers (both want the same hook). An explicit ``@traced`` also tells the reader, in the
source, which steps appear in the trace.

One record per call, written to ``rank{R}.jsonl`` when the call returns; the format is defined
once, in trace/schema.py, which the reader checks records against. A call that may block for
ever (``span(..., blocking=True)``: every torch.distributed call) is also written as it begins,
with the calls open around it, into ``entered/rank{R}.jsonl``, and both files are flushed then:
a rank killed while it waits in a collective leaves on disk everything up to that call, and
what it was waiting in. The other
calls cost nothing more: their open records are written only when a blocking call below them, or
a dump request (trace/dump.py), needs them.

Times are wall-clock microseconds, so the ranks of one machine share a time axis.
When tracing is off, ``_ACTIVE`` is None and a traced function pays one global read and one
extra Python call.

On a GPU the host returns from a step once its kernels are queued, so the clock alone would
time the launch. The accelerator, when it is CUDA, hands this floor a ``device_sync`` callable
(``set_device_sync``: the floor imports no accelerator); a recorder then waits for the device at
each call's start and end, so a span is the GPU time of its work, and says so in the trace (one
schema.CLOCK record). The price: work that overlapped (an async all-reduce behind the backward)
is serialized while tracing. A CPU run has no hook and pays one ``is None`` test per call.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import struct
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Callable

from minitron.trace.schema import CLOCK, ENTERED_DIR, GPU_TIME, new_open_record, new_record, rank_file_name

_ACTIVE: "Recorder | None" = None
_DEVICE_SYNC: Callable[[], None] | None = None   # set_device_sync's, for every recorder started

_PRIMITIVES = (int, float, str, bool, type(None))
# One encoder for every record: json.dumps with separators builds a new encoder per call, a
# third of each record's cost (a 1024-rank fake world writes ~60,000 records). trace.json is
# written with it too (cli/views/perfetto.py): its rows can then reuse a record's encoded args.
ENCODE = json.JSONEncoder(separators=(",", ":")).encode


def short_value(value: Any) -> Any:
    """A JSON-friendly, bounded picture of an argument: primitives as they are, others by type."""
    if isinstance(value, _PRIMITIVES):
        return value if not isinstance(value, str) or len(value) <= 200 else value[:200] + "…"
    if isinstance(value, (list, tuple)) and len(value) <= 64 and all(isinstance(v, int) for v in value):
        return list(value)
    shape = getattr(value, "shape", None)
    if shape is not None:
        return {"tensor": list(shape), "dtype": str(getattr(value, "dtype", "")).replace("torch.", "")}
    return type(value).__name__


class Recorder:
    """Collects the calls of one rank and streams them to ``rank{R}.jsonl``.

    With ``keep``, the records also stay in ``records``, as written, and their JSON lines in
    ``lines``: a process that plays many fake ranks hands them to its parent, which then need
    not parse the files again, nor encode the records' arguments again for trace.json.
    """

    def __init__(self, out_dir: str | os.PathLike, rank: int, keep: bool = False):
        self.rank = rank
        self.records: list[dict] | None = [] if keep else None
        self.lines: list[str] | None = [] if keep else None
        self.pid = os.getpid()
        self.path = Path(out_dir) / rank_file_name(rank)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "w", buffering=1 << 16)
        self._entered = None   # entered/rank{R}.jsonl, opened by the first open record
        (self.path.parent / ENTERED_DIR / self.path.name).unlink(missing_ok=True)   # an earlier run's
        self._next_id = 0
        # The calls now open, innermost last: [id, parent, name, args, start_us]. The first
        # ``_written`` of them have their open record in the file already.
        self._stack: list[list] = []
        self._written = 0
        self._sync: Callable[[], None] | None = None
        self._progress = None   # set_progress: where the launcher's hang watch sees calls end
        # Whether blocking calls are written as they begin. A fake world's collectives never
        # wait, and it plays ~60,000 calls for 1024 ranks: launcher/fake.py turns it off.
        self.open_records = True
        self.use_device_sync(_DEVICE_SYNC)

    def use_device_sync(self, sync: Callable[[], None] | None) -> None:
        """Wait for the device with ``sync`` around every call from now on (None: stop waiting).
        The first time, one CLOCK record tells the reader that the times are GPU time."""
        if sync is not None and self._sync is None:
            call_id, parent, now = self.begin()
            self.end(call_id, parent, now, CLOCK, {"clock": GPU_TIME})
        self._sync = sync

    def set_progress(self, shared, slot: int) -> None:
        """Stamp the wall-clock time into 8 bytes at ``slot`` of ``shared`` (a writable buffer the
        launcher maps too) whenever a call ends: how it sees that the job still moves."""
        self._progress, self._slot = shared, slot * 8

    def begin(self, name: str = "", args: dict | None = None) -> tuple[int, int | None, int]:
        if self._sync is not None:
            self._sync()   # the work queued before this call is not its own
        call_id = self._next_id
        self._next_id += 1
        parent = self._stack[-1][0] if self._stack else None
        now = time.time_ns() // 1000
        self._stack.append([call_id, parent, name, args, now])
        return call_id, parent, now

    def write_open(self) -> None:
        """Write the open record of every open call not yet written, outermost first, and flush:
        what a rank stopped now would have been doing is on disk."""
        if self._entered is None:
            where = self.path.parent / ENTERED_DIR / self.path.name
            where.parent.mkdir(exist_ok=True)
            self._entered = open(where, "w", buffering=1 << 16)
        for call_id, parent, name, args, start in self._stack[self._written:]:
            self._entered.write(ENCODE(new_open_record(self.rank, self.pid, call_id, parent, name, args or {},
                                                       start)) + "\n")
        self._written = len(self._stack)
        self._file.flush()   # the finished calls before this one too: a killed rank keeps them
        self._entered.flush()

    def end(self, call_id: int, parent: int | None, start_us: int, name: str,
            args: dict | None, error: str | None = None) -> None:
        if self._sync is not None:
            self._sync()   # the call's kernels have finished, not merely been launched
        self._stack.pop()
        if self._written > len(self._stack):
            self._written = len(self._stack)
        if self._progress is not None:
            struct.pack_into("d", self._progress, self._slot, time.time())
        record = new_record(self.rank, self.pid, call_id, parent, name, args or {}, start_us,
                            time.time_ns() // 1000)
        if error:
            record["error"] = error
        line = ENCODE(record)
        self._file.write(line + "\n")
        if self.records is not None:
            self.records.append(record)
            self.lines.append(line)

    @contextmanager
    def span(self, name: str, args: dict | None = None, blocking: bool = False):
        """Record the call ``name`` around the block; ``blocking``: a call that waits for other
        ranks, written (with the calls open around it) as it begins."""
        call_id, parent, start = self.begin(name, args)
        if blocking and self.open_records:
            self.write_open()
        try:
            yield args
        except BaseException as exc:
            self.end(call_id, parent, start, name, args, error=f"{type(exc).__name__}: {exc}")
            raise
        self.end(call_id, parent, start, name, args)

    @property
    def closed(self) -> bool:
        return self._file.closed

    def close(self) -> None:
        for f in (self._file, self._entered):
            if f is not None and not f.closed:
                f.close()
        self._progress = None


def active() -> Recorder | None:
    return _ACTIVE


def start(out_dir: str | os.PathLike, rank: int, keep: bool = False) -> Recorder:
    """Begin recording this process's ``@traced`` steps as ``rank`` (``minitron.trace.start``
    also wraps torch.distributed's entry points)."""
    global _ACTIVE
    stop()
    _ACTIVE = Recorder(out_dir, rank, keep)
    return _ACTIVE


def set_device_sync(sync: Callable[[], None] | None) -> None:
    """The device's synchronize, for the recorders to wait on (None on a CPU: nothing to wait
    for). Set by the accelerator once it knows it is CUDA, before or after recording starts; it
    must not start the device itself (before the rank picks its GPU, nothing is queued)."""
    global _DEVICE_SYNC
    _DEVICE_SYNC = sync
    if _ACTIVE is not None:
        _ACTIVE.use_device_sync(sync)


def stop() -> None:
    """Flush and stop recording."""
    global _ACTIVE
    if _ACTIVE is not None:
        _ACTIVE.close()
        _ACTIVE = None


def _bound_args(signature: inspect.Signature, args, kwargs) -> dict:
    try:
        bound = signature.bind_partial(*args, **kwargs)
    except TypeError:
        return {}
    return {k: short_value(v) for k, v in bound.arguments.items() if k not in ("self", "cls")}


def traced(fn: Callable | None = None, *, name: str | None = None, args: Callable | None = None):
    """Mark a step so that it appears in the trace.

    ``@traced`` records the call's primitive arguments (ints, strings, short int lists) and the
    shapes of tensors. ``args=`` takes a function of the call's own arguments that returns the
    dict to record instead, for steps whose interesting facts are not plain arguments.
    """
    def decorate(f: Callable) -> Callable:
        qualified = name or f"{f.__module__}.{f.__qualname__}"
        signature = inspect.signature(f)

        @functools.wraps(f)
        def wrapper(*a, **kw):
            recorder = _ACTIVE
            if recorder is None:
                return f(*a, **kw)
            recorded = args(*a, **kw) if args else _bound_args(signature, a, kw)
            with recorder.span(qualified, recorded):
                return f(*a, **kw)

        wrapper.__traced__ = qualified
        return wrapper

    return decorate(fn) if fn is not None else decorate
