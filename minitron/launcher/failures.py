"""When ranks fail: which one failed first, and how that is told (RankFailure).

One rank's leaving makes its peers fail moments later in their next collective with it, so
the first death the launcher notices is often a bystander's. This module keeps the evidence
(when the launcher saw each rank die, when each raising rank raised and why) and weighs it.
"""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path


class RankFailure(RuntimeError):
    """A run failed; carries the rank that caused it (see first_failure), how it ended and where
    its output went."""

    def __init__(self, rank: int, exitcode: int, log_path: Path | None):
        self.rank, self.exitcode, self.log_path = rank, exitcode, log_path
        self._kept: list[str] | None = None
        if exitcode < 0:
            how = f"was killed by {_signal_name(-exitcode)}"
        elif exitcode == 0:   # named because it left first: the others failed when they lost it
            how = "exited with code 0 while the other ranks still needed it (they failed on losing it)"
        else:
            how = f"exited with code {exitcode}"
        where = f"; its log: {log_path}" if log_path else ""
        super().__init__(f"rank {rank} {how}{where}")

    def log_tail(self, lines: int = 15) -> str:
        if self._kept is not None:
            return "\n".join(self._kept[-lines:])
        if not self.log_path or not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])

    def keep_log_tail(self, lines: int = 60) -> None:
        """Read the log's end now, for a log that is about to be deleted (a scratch directory)."""
        self._kept = self.log_tail(lines).splitlines()


class JobHung(RankFailure):
    """No rank finished a traced call for the hang timeout: the job was diagnosed and stopped
    (launcher/hang_watch.py). No one rank failed; ``rank`` is None."""

    def __init__(self, timeout: float, silent: list[int]):
        RuntimeError.__init__(self, f"hung: no rank finished a traced call for {timeout:g} s; every rank was "
                              "stopped" + (f" ({'rank' if len(silent) == 1 else 'ranks'} {', '.join(map(str, silent))} did not "
                                           f"say where {'it was' if len(silent) == 1 else 'they were'})" if silent else ""))
        self.rank, self.exitcode, self.log_path, self._kept = None, 1, None, None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class DeathOrder:
    """When each rank left, as the launcher sees it: ``seen[rank]`` is a time.time(), the clock
    the ranks stamp their failures with (worker.record_failure), so the two can be compared.

    A pidfd (Linux 5.3+) becomes readable the moment its process exits, so waiting on all of
    them wakes us within microseconds of a death, long before a peer that lost its connection
    has raised, printed its traceback and exited. A rank that exits 0 is noted too: a rank that
    leaves early, even cleanly, is a peer the others lose. Without pidfds it falls back to
    noting deaths at each 10 ms poll.
    """

    def __init__(self, procs: list):
        self.procs, self.seen, self.fds = procs, {}, {}
        for rank, p in enumerate(procs):
            try:
                self.fds[os.pidfd_open(p.pid)] = rank
            except (AttributeError, OSError):  # not Linux, or an old kernel
                pass

    def wait(self, timeout: float) -> None:
        open_fds = [fd for fd, rank in self.fds.items() if rank not in self.seen]
        if open_fds:
            ready = select.select(open_fds, [], [], timeout)[0]
        else:
            ready = []
            time.sleep(timeout)
        now = time.time()
        for fd in ready:
            self.seen[self.fds[fd]] = now
        for rank, p in enumerate(self.procs):  # ranks without a pidfd: seen at this poll
            if rank not in self.seen and p.poll() is not None:
                self.seen[rank] = now

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def first_failure(procs: list, errors: Path, deaths: DeathOrder | None = None,
                  settle: float = 0.3) -> tuple[int, int]:
    """(rank, exit code) of the first rank to leave that explains the others' failures.

    When one rank leaves, its peers fail moments later in their next collective with it, and
    any of them may be the first we notice. So wait a little for the others, then put every
    rank that has left on one time line: a rank whose program raised wrote when it raised
    into ``errors`` (worker.record_failure), and whether it raised because a peer had gone;
    any other (killed by a signal, gone by os._exit, or exited 0) left when the launcher saw
    it die. The order of reaping says nothing: a rank printing a long traceback is reaped
    after a bystander killed a moment later.

    A rank that raised because it lost a peer is a symptom, never the cause while another
    rank failed for a reason of its own: the earliest of those is named (its death may be
    seen late, as a core dump holds a process, but its peers only raise once it has gone).
    When every failure is a lost peer, the first rank to leave is the cause, even one that
    exited 0: it left while the others still needed it.
    """
    deaths = deaths or DeathOrder(procs)
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline and None in [p.poll() for p in procs]:  # poll all: no short cut
        deaths.wait(0.02)
    deaths.wait(0)
    now = time.time()
    left = {}   # rank -> (when it left, exit code, whether it raised because it lost a peer)
    for rank, p in enumerate(procs):
        if p.returncode is None:
            continue
        when, lost = deaths.seen.get(rank, now), False
        stamp = errors / f"rank{rank}"
        if p.returncode != 0 and stamp.exists():
            raised, _, why = stamp.read_text().partition(" ")
            when, lost = float(raised or when), why == "peer-lost"
        left[rank] = (when, p.returncode, lost)
    causes = {rank: x for rank, x in left.items() if x[1] != 0 and not x[2]} or left
    rank = min(causes, key=lambda r: (causes[r][0], r))
    return rank, causes[rank][1]
