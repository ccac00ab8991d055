"""The trace directory `minitron trace` writes into: what a previous run left there goes first.

Clearing a thousand rank files is the kernel's work more than Python's (ext4 freeing each
file's blocks: ~0.05 s of CPU, 0.1-0.15 s of wall time for a 1024-rank fake trace run again
into the same directory, 2 cores). The command's process meanwhile imports torch and the
launcher (~1 s, one core), so a forked child clears the directory on the other core, and the
command waits for it just before any rank starts (clear_meanwhile).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Callable, Iterable

from minitron.cli.common import UserError
from minitron.trace.schema import RANK_FILE


def clear_previous_run(out: Path, ranks) -> None:
    """Leave nothing of a previous run in ``out`` that this one does not write again: its
    trace.json and the files of ranks not in ``ranks`` go (a previous, larger run must not
    leak ranks into this one); the files of ``ranks`` are emptied, and each is written again
    in place. Emptied, not removed: a run that stops early leaves no earlier run's records
    under its ranks, and the files keep their inodes. ext4 creating a thousand files just after
    deleting a thousand scans past every inode freed a moment ago, under a lock the players
    share: ~0.5 s of a 1024-rank fake trace run again into the same directory (2 cores)."""
    for path in out.glob("rank*.jsonl"):
        name = RANK_FILE.fullmatch(path.name)
        if name and int(name.group(1)) in ranks and path.is_file() and not path.is_symlink():
            os.truncate(path, 0)
        else:
            path.unlink(missing_ok=True)
    (out / "trace.json").unlink(missing_ok=True)


def clear_meanwhile(out: Path, ranks: Iterable[int]) -> Callable[[], None]:
    """Create ``out`` and clear_previous_run it in a forked child; returns the wait, which
    raises UserError (the child has said why, in one line) if the directory could not be
    cleared. Nothing may write into ``out`` before the wait returns."""
    sys.stdout.flush()  # or the child's exit would not matter, but a copy of unflushed output could
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            out.mkdir(parents=True, exist_ok=True)
            clear_previous_run(out, ranks)
            code = 0
        except OSError as exc:
            print(f"minitron: error: cannot clear {out} of the previous run: {exc}", file=sys.stderr)
        finally:
            sys.stderr.flush()
            os._exit(code)  # nothing of the command's own exit (atexit hooks, buffers) is the child's

    def wait() -> None:
        if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) != 0:
            raise UserError(f"--out {out}: the previous run's files could not be cleared (see above)")

    return wait
