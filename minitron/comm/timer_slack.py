"""Timer slack for the process groups' threads: machinery of this CPU build, not Megatron's.

gloo gives every process group a transport thread whose loop wakes every 10 ms to look for work
even when there is none, and a rank belongs to some twenty groups (every kind, even at world 1):
thousands of wake-ups a second, measured at 2-5% of a CPU training step on a loaded 2-core
machine. Linux lets a thread say how late its timed sleeps may end (its timer slack), and a new
thread inherits its creator's. pretrain() wraps initialize_megatron in the context manager below:
the threads created meanwhile tick 4-5x less often when idle, while a message still wakes them
at once (the wait is on the socket, not the timer). The caller's own slack is restored after.
"""

from __future__ import annotations

import contextlib
import ctypes
import sys

_PR_SET_TIMERSLACK, _PR_GET_TIMERSLACK = 29, 30
_TRANSPORT_TIMER_SLACK_NS = 40_000_000


@contextlib.contextmanager
def slack_timers_for_new_threads():
    """While inside, threads this thread starts may wake up to 40 ms late from a timed sleep
    (Linux; elsewhere nothing changes)."""
    if not sys.platform.startswith("linux"):
        yield
        return
    prctl = ctypes.CDLL(None, use_errno=True).prctl
    previous = prctl(_PR_GET_TIMERSLACK, 0, 0, 0, 0)
    prctl(_PR_SET_TIMERSLACK, _TRANSPORT_TIMER_SLACK_NS, 0, 0, 0)
    try:
        yield
    finally:
        prctl(_PR_SET_TIMERSLACK, max(previous, 1), 0, 0, 0)
