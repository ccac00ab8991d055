"""A rank's processes: each rank leads a process group, and the group is what gets stopped.

A rank may start processes of its own (data-loader workers, a multiprocessing daemon, a
debugger adapter, a shell command). They belong to the rank's process group, which the rank
leads (it starts a session of its own), so one signal to the group reaches all of them, and the
launcher sends it when the run ends, however it ends. Used for forked and spawned ranks
(launch.py) and for the copies that play a fake world (fake.py).
"""

from __future__ import annotations

import os
import signal
import time
from contextlib import contextmanager
from typing import Iterator

# What stops a launch from outside: Ctrl-C, and the SIGTERM of whoever started it.
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


@contextmanager
def stop_signals_held() -> Iterator[set]:
    """While children are forked: a stop signal waits until each one's pid is on our list.

    Python runs a signal's handler at the next bytecode, wherever that falls. During os.fork
    it falls in the at-fork hooks (logging's lock release is one), where an exception cannot
    propagate: the KeyboardInterrupt, or --save_pid's SystemExit, is printed as "ignored" and
    lost, and the launcher waits on for ranks nobody stops. Even right after the fork, a stop
    before ``procs.append`` would lose the pid of a child that then runs on. Held, the signal
    arrives as the block ends, when every child is in the list that the stop walks.

    Yields the mask from before: each forked child puts it back first thing (it inherits the
    block). Only for forks: a program we exec would inherit the block and never hear SIGTERM.
    """
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
    try:
        yield held
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)


class ForkedProcess:
    """A forked child (a rank, a copy playing fake ranks) with the small part of Popen's
    interface the launcher needs."""

    def __init__(self, pid: int):
        self.pid, self.returncode = pid, None

    def poll(self):
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self) -> int:
        while self.returncode is None:
            self.returncode = os.waitstatus_to_exitcode(os.waitpid(self.pid, 0)[1])
        return self.returncode


def _group_alive(pgid: int) -> bool:
    """Whether process group ``pgid`` still holds a process that is not a zombie.

    An orphan that has exited stays a member of its group until its new parent (init, or a
    container's first process, which may be slow to do it) reaps it; it can do no harm, so it
    does not count.
    """
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        entries = os.listdir("/proc")
    except OSError:  # not Linux: believe the signal
        return True
    for name in entries:
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    fields = f.read().rpartition(")")[2].split()
            except OSError:
                continue
            if int(fields[2]) == pgid and fields[0] != "Z":   # fields: state, ppid, pgrp, ...
                return True
    return False


def stop_process_groups(procs: list, grace: float, first: int = signal.SIGTERM) -> None:
    """End every rank and everything it started: SIGTERM each rank's process group, wait up to
    ``grace`` s for the groups to empty, then SIGKILL what is left, and reap the ranks.

    A rank leads a session of its own (setsid, start_new_session), so its group holds what it
    started: a data-loader worker, a multiprocessing daemon, a debugger adapter, a shell
    command. Nothing else would stop those: a forked rank leaves by os._exit, which skips
    multiprocessing's clean-up of its daemons, and an orphan is nobody's child. So the groups
    are signalled whether the ranks failed or all exited 0, and those of ranks already gone
    too: a group outlives its leader while any member lives.
    """
    def signal_groups(sig) -> None:
        for p in procs:
            try:
                os.killpg(p.pid, sig)
            except ProcessLookupError:
                # No such group yet: the rank may not have reached setsid(). Signal it alone.
                if p.poll() is None:
                    try:
                        os.kill(p.pid, sig)
                    except ProcessLookupError:
                        pass
            except PermissionError:
                pass

    signal_groups(first)   # SIGKILL for a hung job: its peers would each print a lost connection
    deadline = time.monotonic() + grace
    # poll() first: it reaps a rank that has exited, and a zombie rank still counts in its group.
    while time.monotonic() < deadline and any(p.poll() is None or _group_alive(p.pid) for p in procs):
        time.sleep(0.02)
    signal_groups(signal.SIGKILL)
    for p in procs:
        while p.poll() is None:
            time.sleep(0.01)
