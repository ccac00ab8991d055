"""The tokenizing processes of ``preprocess``: each with a pipe of its own, fed in turn.

Not multiprocessing.Pool: its workers share one task queue behind one lock, and an idle
worker waits for a task holding that lock. Pool.terminate() takes the same lock first, so
a Ctrl-C at the wrong moment left it waiting forever (seen in 4 of 9 runs, and in CI). Here
nothing is shared: batch i goes to worker i mod n, results come back in the same order, and
stopping is a SIGKILL to each worker, which no lock can hold up.
"""

from __future__ import annotations

import gc
import multiprocessing
import signal
from collections import deque


class Workers:
    """``n`` forked processes, each running ``initializer(spec)`` once, then ``work`` on every
    batch it is sent (the functions travel by fork: nothing is pickled but batches and results)."""

    def __init__(self, n: int, initializer, spec: dict, work):
        ctx = multiprocessing.get_context("fork")
        self.conns, self.procs = [], []
        # Ctrl-C reaches the whole foreground process group; workers ignore it (inherited from
        # the fork, so there is no moment when they do not) and the parent stops them.
        default = signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            for _ in range(n):
                ours, theirs = ctx.Pipe()
                proc = ctx.Process(target=_serve, args=(theirs, initializer, spec, work), daemon=True)
                proc.start()
                theirs.close()
                self.conns.append(ours)
                self.procs.append(proc)
        finally:
            signal.signal(signal.SIGINT, default)

    def ordered(self, batches):
        """``work`` of each batch, in input order. A worker gets its next batch only after
        its last result was read, so neither side ever blocks sending to the other."""
        busy: deque = deque()
        for i, batch in enumerate(batches):
            worker = i % len(self.conns)
            if len(busy) == len(self.conns):
                yield self._receive(busy.popleft())
            self.conns[worker].send(batch)
            busy.append(worker)
        while busy:
            yield self._receive(busy.popleft())

    def _receive(self, worker: int):
        try:
            return self.conns[worker].recv()
        except EOFError:
            self.procs[worker].join(5)  # its pipe closed as it died: the exit code is a moment away
            raise RuntimeError(f"tokenizing worker {worker} died (exit code {self.procs[worker].exitcode})") from None

    def stop(self) -> None:
        for proc in self.procs:
            proc.kill()
        for proc, conn in zip(self.procs, self.conns):
            proc.join()
            conn.close()


def _serve(conn, initializer, spec: dict, work) -> None:
    """A worker: build the tokenizer once, then tokenize what comes until it is killed."""
    gc.enable()  # forked from the command line, which runs with the collector off (cli/__init__.py)
    initializer(spec)
    while True:
        conn.send(work(conn.recv()))
