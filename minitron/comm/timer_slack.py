"""Timer slack for the process groups' threads: machinery of this CPU build, not Megatron's.

gloo gives every process group a transport thread whose loop wakes every 10 ms to look for work
even when there is none, and a rank belongs to some twenty groups (every kind, even at world 1):
thousands of wake-ups a second, measured at 2-5% of a CPU training step on a loaded 2-core
machine. Linux lets a thread say how late its timed sleeps may end (its timer slack), and a new
thread inherits its creator's. pretrain() wraps initialize_megatron in the context manager below:
the threads created meanwhile tick 4-5x less often when idle, while a message still wakes them
at once (the wait is on the socket, not the timer). The caller's own slack is restored after.

The same tick sets the price of leaving: a group's destructor stops its transport thread and
joins it, and the thread only sees the request at its next tick, up to 10 + 40 ms later.
release_together (below) lets a rank pay that once for all its groups, not once per group.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import sys
import threading

_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30
_TRANSPORT_TIMER_SLACK_NS = 40_000_000


@functools.cache
def _prctl():
    """libc's prctl, looked up once: loading the library handle and the function each time cost
    ~50 us, once per rank, a thousand times in a fake world's play."""
    return ctypes.CDLL(None, use_errno=True).prctl


@contextlib.contextmanager
def slack_timers_for_new_threads():
    """While inside, threads this thread starts may wake up to 40 ms late from a timed sleep
    (Linux; elsewhere nothing changes)."""
    if not sys.platform.startswith("linux"):
        yield
        return
    prctl = _prctl()
    previous = prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    prctl(_PR_SET_TIMERSLACK, _TRANSPORT_TIMER_SLACK_NS, 0, 0, 0)
    try:
        yield
    finally:
        prctl(_PR_SET_TIMERSLACK, max(previous, 1), 0, 0, 0)


def release_together(groups: list) -> None:
    """Drop the last references to ``groups`` (the caller holds no other), each on a thread of
    its own, and wait until every one is destroyed.

    torch destroys a process group without holding the GIL, so the destructors overlap and
    their waits for a transport tick with them. One after the other, a rank's twenty gloo
    groups kept it 0.5-0.7 s at exit (2 cores; ~20x the CPU time it had used): every traced
    world of gloo ranks ended that much later than its last rank's work."""
    threads = [threading.Thread(target=list.clear, args=([group],), name="release-group") for group in groups]
    groups.clear()  # from here each group is held by its thread alone, which drops it
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
