"""The fake backend: a few processes play every rank of a large world, one after another.

torch ships a "fake" process group for exactly this: init_process_group accepts any rank and
world size, and every collective returns at once without moving data. So the real
initialisation code runs for rank 0, then for rank 1, ... each time building the real groups
that rank would build. What you learn is the layout and the call structure at a scale no
laptop could run; what you do not get is communication — every collective is a no-op.

The rules of a fake world live here, in the launcher that plays it, not in the tracer (which
only records, fake world or not). There are two, both about ``new_group``:

* Every group is a fake group. Megatron asks for gloo twins of some groups (``backend="gloo"``);
  in a fake world there is nothing to connect, so the backend is dropped. The trace still shows
  what the program asked for: this rule sits beneath the tracer's wrapper.
* A rank outside a group gets torch's "not a member" answer at once. Each rank calls new_group
  for every group of the world (about 3 x world of them: ~3.5 million calls at world 1024,
  tp 8, pp 8), and torch would create nothing for a non-member anyway. This rule sits above
  the tracer, so those calls cost one membership test and leave no record: a rank's trace
  holds the ~20 groups it is in, not the 3,400 it is not. They are counted instead, per
  group description, and the count is the one thing recorded of them (below).

Each played rank's trace ends with one record of the play itself, ``play_rank`` (schema.PLAYED):
the world, which ranks were played (``"all"``, or the chosen ones: a partial trace says which
ranks it holds), and how many new_group calls of each description were answered unrecorded.

Since a rank's groups follow from the layout alone, nothing obliges us to play every rank:
``ranks`` picks a few of a world of any size. Each still walks every group of the world, as
Megatron's initialize_model_parallel does (O(world) per rank), so the cost is the number of
ranks played times the world, never the world squared.
"""

from __future__ import annotations

import gc
import marshal
import os
import signal
import sys
import tempfile
import threading
import traceback
from collections import Counter
from contextlib import contextmanager
from typing import Callable, Iterable, Iterator, TypeVar

import torch.distributed as dist

from minitron import trace
from minitron.launcher.launch import frozen_heap
from minitron.launcher.processes import ForkedProcess, stop_process_groups, stop_signals_held
from minitron.launcher.worker import rank_session
from minitron.trace import TRACE_DIR_ENV
from minitron.trace.schema import PLAYED

T = TypeVar("T")

_RANK_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", TRACE_DIR_ENV)


@contextmanager
def _only_fake_groups():
    """Rule 1, for the whole play: new_group ignores the backend it is asked for."""
    original = dist.new_group

    def new_group(ranks=None, timeout=None, backend=None, *args, **kwargs):
        return original(ranks, timeout, None, *args, **kwargs)

    dist.new_group = new_group
    try:
        yield
    finally:
        dist.new_group = original


@contextmanager
def _non_members_answered(rank: int):
    """Rule 2, while ``rank`` is played: a group without it is answered before anyone sees it.
    Yields a dict that, once the rank is done, counts those calls per group description."""
    inner = dist.new_group  # the tracer's wrapper when tracing, else rule 1
    non_member = dist.GroupMember.NON_GROUP_MEMBER
    answered: list = []  # each call's description: an append is the cheapest note (millions of calls)
    counts: dict[str, int] = {}

    def new_group(ranks=None, timeout=None, backend=None, pg_options=None,
                  use_local_synchronization=False, group_desc=None, **kwargs):
        if ranks is not None and rank not in ranks:
            answered.append(group_desc)
            return non_member
        return inner(ranks, timeout, backend, pg_options, use_local_synchronization, group_desc, **kwargs)

    dist.new_group = new_group
    try:
        yield counts
    finally:
        dist.new_group = inner
        counts.update((str(desc), n) for desc, n in Counter(answered).items())  # Counter counts in C


def play_ranks(world_size: int, rank_main: Callable[[], object], trace_dir: str | os.PathLike | None = None,
               ranks: Iterable[int] | None = None, processes: int | None = None,
               keep: Callable[[int, list[dict], list[str]], T] | None = None) -> dict[int, T]:
    """Call ``rank_main()`` as each rank in ``ranks`` (default: all) of a fake world in turn.

    Each rank sees torchrun's variables (RANK, WORLD_SIZE, ...) and runs in a rank session,
    traced into ``trace_dir`` if given. ``rank_main`` must leave no state behind for the next
    rank (destroy the process group and whatever globals it set). ``processes`` (default: one
    per core) forked copies of this process share the ranks out; 1 plays them all here.

    ``keep(rank, records, lines)``, if given with ``trace_dir``, sees each rank's trace records
    as they were written (and their JSON lines), in the process that played the rank; what it
    returns comes back here, as ``{rank: kept}`` in rank order. The caller gets a thousand
    ranks' traces without parsing their files again, and the copies do the per-rank work in
    parallel.
    """
    ranks = list(range(world_size) if ranks is None else ranks)
    played = "all" if len(ranks) == world_size else sorted(ranks)  # what each trace says it holds
    processes = min(processes or os.cpu_count() or 1, len(ranks))
    if processes <= 1:
        kept = _play(world_size, rank_main, trace_dir, ranks, keep, played)
    else:
        kept = _play_in_processes(world_size, rank_main, trace_dir, ranks, processes, keep, played)
    return dict(sorted(kept.items()))


def _play(world_size: int, rank_main: Callable[[], object], trace_dir, ranks: Iterable[int], keep,
          played="all") -> dict:
    saved_env = {k: os.environ.get(k) for k in _RANK_VARS}
    kept = {}
    try:
        with _only_fake_groups():
            for rank in ranks:
                os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world_size),
                                  LOCAL_WORLD_SIZE=str(world_size))
                recorder = None
                if trace_dir:
                    os.environ[TRACE_DIR_ENV] = str(trace_dir)
                    recorder = trace.start(trace_dir, rank, keep=keep is not None)  # the session below joins it
                    recorder.open_records = False   # fake collectives never wait: no hang to see
                try:
                    with rank_session(), _non_members_answered(rank) as unrecorded:  # counted on exit
                        rank_main()
                    if recorder is not None:  # the play's own record, last: see the module's docstring
                        with recorder.span(PLAYED, {"world_size": world_size, "ranks": played,
                                                    "unrecorded_new_groups": unrecorded}):
                            pass
                finally:
                    if recorder is not None:
                        trace.stop()
                if recorder is not None and keep is not None:
                    kept[rank] = keep(rank, recorder.records, recorder.lines)
    finally:
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    return kept


def _on_fresh_stack(fn: Callable[..., T], *args) -> T:
    """``fn(*args)`` on a new thread, waited for. Without CUDA, every torch.manual_seed makes
    torch.cuda (and xpu, mtia) format the whole Python stack for a later error message, three
    times per rank; a thread starts with an empty stack instead of the command line's frames
    under play_ranks (32 frames deep there, 23 here: a quarter less to format, ~0.2 ms a rank)."""
    outcome: dict = {}

    def run() -> None:
        try:
            outcome["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 -- raised again below, in the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name="fake-ranks")
    thread.start()
    thread.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


# 1024 ranks of 4 bytes: PIPE_BUF, the most one write puts in a pipe at once (never split).
_CARDS_PER_WRITE = 1024


def _dealt(deck: int) -> Iterator[int]:
    """The ranks one copy plays: it reads the next from the pipe each time it is free. Every
    rank's 4 bytes arrive whole (see _CARDS_PER_WRITE), so a read of 4 takes exactly one."""
    while len(card := os.read(deck, 4)) == 4:
        yield int.from_bytes(card, "little")


def _settled(keep):
    """``keep`` for a forked copy, which plays hundreds of ranks and holds what each one kept:
    after each rank, one collection of what that rank left behind, then the survivors (its kept
    records, mostly) frozen. Each full pass of the cyclic collector walks every object not
    frozen: left alone, it walks the records of all the ranks played so far again and again
    (~7% of a copy's CPU at 512 ranks); frozen, each rank's objects are walked once."""
    if keep is None:
        return None

    def kept(rank: int, records: list[dict], lines: list[str]):
        result = keep(rank, records, lines)
        gc.collect()  # everything older is frozen already: a walk of this rank's objects only
        gc.freeze()
        return result

    return kept


def _play_copy(i: int, deck: int, dealer: int, scratch: str, world_size: int, rank_main, trace_dir, keep, played,
               mask: set):
    """Body of forked copy ``i``: play the ranks dealt to it, marshal what ``keep`` returned. Never returns.
    ``mask``: the signal mask to put back (forked with stop signals held)."""
    code = 1
    try:
        os.setsid()  # a group of its own, which the parent stops at the end with whatever a rank started
        os.close(dealer)  # or the deck would never run out: a pipe ends when every writer has closed it
        gc.enable()  # the command line turned the collector off for itself; what we inherited stays frozen
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        kept = _on_fresh_stack(_play, world_size, rank_main, trace_dir, _dealt(deck), _settled(keep), played)
        with open(os.path.join(scratch, f"{i}.kept"), "wb") as f:
            f.write(marshal.dumps(kept))
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _play_in_processes(world_size: int, rank_main, trace_dir, ranks: list[int], processes: int, keep,
                       played) -> dict:
    """Deal the ranks out to forked copies of this process, one per core.

    In a fake world the ranks never talk to each other, so they can be played in any order
    and in any process; each rank's trace file is still written by the process that played
    it, and what ``keep`` returned travels back in a scratch file per copy. A copy that fails
    has printed its traceback; the others are stopped, and we raise.

    Written with marshal, not pickle: the reader is this same interpreter, and what comes back
    is plain data (a rank's records: dicts, lists, strings, numbers), which marshal writes
    without pickle's memo of every object: 512 ranks' records and rows in ~50 ms, not ~130, at
    the end of each copy's play, where the parent waits for it. (``keep`` must return such
    data; anything else is a ValueError in the copy.)

    The ranks are dealt one at a time, to whichever copy is free (see _dealt): on a machine
    shared with other work one copy can run a tenth slower than the other, and a fixed half
    each would leave a core idle for that long at the end.
    """
    copies: list[ForkedProcess] = []
    deck, dealer = os.pipe()
    # As files, so that each end is closed once, whatever happens: a closed descriptor's
    # number may already belong to something else.
    with open(deck, "rb", buffering=0) as reading, open(dealer, "wb", buffering=0) as dealing, \
            tempfile.TemporaryDirectory(prefix="minitron-fake-") as scratch:
        try:
            with frozen_heap(), stop_signals_held() as mask:
                for i in range(processes):
                    sys.stdout.flush()
                    sys.stderr.flush()
                    pid = os.fork()
                    if pid == 0:
                        _play_copy(i, deck, dealer, scratch, world_size, rank_main, trace_dir, keep, played, mask)
                    copies.append(ForkedProcess(pid))
            reading.close()  # the copies read the deck; we only deal it
            try:
                for start in range(0, len(ranks), _CARDS_PER_WRITE):
                    dealing.write(b"".join(r.to_bytes(4, "little") for r in ranks[start:start + _CARDS_PER_WRITE]))
            except BrokenPipeError:
                pass  # every copy has stopped: their exit codes below say why
            dealing.close()  # the end of the deck: a copy's next read finds nothing and it stops
            kept, failed = {}, 0
            for i, copy in enumerate(copies):
                # Each copy's records read as soon as it is done: the next may still be writing its own.
                if copy.wait() != 0:
                    failed += 1
                elif not failed:
                    kept.update(_read_kept(os.path.join(scratch, f"{i}.kept")))
        finally:
            # Each copy's group, finished or not: what a played rank started there ends with it.
            # A copy still running means we were interrupted: no grace, it is killed at once.
            stop_process_groups(copies, grace=0)
        if failed:
            raise RuntimeError(f"{failed} of the {processes} processes playing the fake world failed "
                               f"(traceback above)")
        return kept


def _read_kept(path: str) -> dict:
    """What one copy's ranks kept. A thousand ranks' records are ~60,000 small dicts: read back
    with the cyclic collector on, it walks them again and again as they arrive (twice the
    time), finding nothing."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        with open(path, "rb") as f:
            return marshal.loads(f.read())  # marshal.load(f) would read the file object by object
    finally:
        if collecting:
            gc.enable()
