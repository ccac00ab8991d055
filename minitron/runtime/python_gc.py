"""``disable_python_gc`` (DeepSpeed 0.19.8's ``runtime/python_gc.py``): Python's cyclic garbage
collector stops the whole process at moments of its own choosing, and on a data-parallel run
each rank at a different moment, so one rank's pause stalls every collective the others wait
in. The engine collects once and turns automatic collection off for as long as it lives; the
training loop collects when it chooses (``engine.collect_python_gc()``) at a point where every
rank is anyway. Reference counting still frees everything without cycles.

Several engines in one process share the switch: the first one turns collection off (if it
was on), the last one to go turns it back on.
"""

from __future__ import annotations

import gc
import threading

from minitron.runtime.utils import logger

_lock = threading.Lock()
_engines = 0
_restore = False


def acquire() -> None:
    global _engines, _restore
    with _lock:
        if _engines == 0:
            _restore = gc.isenabled()
            if _restore:
                collected = gc.collect()
                gc.disable()
                logger.info(f"Disabled automatic Python cyclic GC after collecting {collected} objects")
        _engines += 1


def release() -> None:
    global _engines, _restore
    with _lock:
        if _engines == 0:
            return
        _engines -= 1
        if _engines == 0 and _restore:
            _restore = False
            if not gc.isenabled():
                gc.enable()
                logger.info("Restored automatic Python cyclic GC")


def collect() -> int:
    """One explicit collection; automatic collection stays as it is."""
    return gc.collect()
