"""A time limit for a command run in this process (cli_here.minitron_here), as subprocess.run's
``timeout`` was for the same command run as a fresh `minitron`.

    with deadline(300):
        done = run_minitron("pretrain", ..., here=True)

When the limit passes, TimeoutError is raised in this (the main) thread, wherever it is: in the
launcher's wait for its ranks, that stops the ranks and goes on up, and minitron_here returns it
as exit code 1 with the traceback on stderr, which the test's exit-code check shows. A forked
rank does not inherit the timer (POSIX: timers are not kept across fork).
"""

from __future__ import annotations

import signal
from contextlib import contextmanager


@contextmanager
def deadline(seconds: float):
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
