"""When ranks fail: which one failed first, and how that is told (RankFailure).

One rank's death makes its peers fail moments later in their next collective with it, so the
first death the launcher notices is often a bystander's. This module keeps the evidence (the
order the launcher saw the deaths, the time each raising rank wrote) and weighs it.
"""

from __future__ import annotations

import os
import select
import signal
import time
from pathlib import Path


class RankFailure(RuntimeError):
    """A rank exited non-zero; carries which one and where its output went."""

    def __init__(self, rank: int, exitcode: int, log_path: Path | None):
        self.rank, self.exitcode, self.log_path = rank, exitcode, log_path
        self._kept: list[str] | None = None
        how = f"was killed by {_signal_name(-exitcode)}" if exitcode < 0 else f"exited with code {exitcode}"
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


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class DeathOrder:
    """The order in which ranks die, as the launcher sees it.

    A pidfd (Linux 5.3+) becomes readable the moment its process exits, so waiting on all of
    them wakes us within microseconds of the first death, long before a peer that lost its
    connection has raised, printed its traceback and exited. Deaths seen in the same wake-up
    share a number. Without pidfds it falls back to noting deaths at each 10 ms poll.
    """

    def __init__(self, procs: list):
        self.procs, self.seen, self.tick, self.fds = procs, {}, 0, {}
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
        self.tick += 1
        for fd in ready:
            self.seen[self.fds[fd]] = self.tick
        for rank, p in enumerate(self.procs):  # ranks without a pidfd: seen at this poll
            if rank not in self.seen and p.poll() is not None:
                self.seen[rank] = self.tick

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)


def first_failure(procs: list, errors: Path, deaths: DeathOrder | None = None,
                   settle: float = 0.3) -> tuple[int, int]:
    """(rank, exit code) of the rank that failed first.

    When one rank dies, its peers fail moments later in their next collective with it, and
    any of them may be the first we notice. So wait a little for the others, then weigh two
    kinds of evidence. A rank whose program raised wrote the time it raised into ``errors``
    (worker.record_failure): among those, the earliest raised first. A rank that died
    without raising (a signal such as SIGSEGV, or os._exit) wrote nothing — but its peers
    only fail after it, by raising ("Connection reset by peer"). So a rank killed by a signal
    is the culprit (the earliest seen, if several): its death may even be seen last, as a
    core dump holds the process for a while after its sockets have closed. A rank gone by
    os._exit is the culprit when the launcher saw it die no later than the first that raised,
    or when every rank that raised says its peer had gone (a busy machine can show the
    bystander's death first).
    """
    deaths = deaths or DeathOrder(procs)
    deadline = time.monotonic() + settle
    while time.monotonic() < deadline and None in [p.poll() for p in procs]:  # poll all: no short cut
        deaths.wait(0.02)
    deaths.wait(0)
    failed = [(rank, p.returncode) for rank, p in enumerate(procs) if p.returncode not in (None, 0)]
    seen = {rank: deaths.seen.get(rank, deaths.tick + 1) for rank, _ in failed}
    stamped, silent = [], []
    for rank, code in failed:
        stamp = errors / f"rank{rank}"
        if stamp.exists():
            when, _, why = stamp.read_text().partition(" ")
            stamped.append((float(when or "inf"), seen[rank], rank, code, why == "peer-lost"))
        else:
            silent.append((seen[rank], rank, code))
    signalled = sorted(x for x in silent if x[2] < 0)
    if signalled:  # peers fail by raising, never by a signal: a signalled rank is the cause
        _, rank, code = signalled[0]
        return rank, code
    if silent and (not stamped or min(silent)[0] <= min(s[1] for s in stamped)
                   or all(s[4] for s in stamped)):
        _, rank, code = min(silent)
        return rank, code
    if stamped:
        _, _, rank, code, _ = min(stamped)
        return rank, code
    return failed[0]
