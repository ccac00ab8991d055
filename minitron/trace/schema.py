"""The trace record format, defined once: the recorder writes records with ``new_record`` and the
reader checks them against ``FIELDS``, so the two cannot drift apart.

A trace directory holds one file per rank, ``rank{R}.jsonl``, one JSON object per finished call::

    {"rank": 5, "pid": 4711, "id": 12, "parent": 3, "name": "minitron.core.parallel_state.
     initialize_model_parallel", "args": {...}, "start_us": ..., "end_us": ...}

plus ``"error"`` when the call raised. A call that may block (every wrapped torch.distributed
call, and the calls open around it) is also written when it *begins*, as an open record: the same
fields less ``end_us``, with ``"open": true``, in a file of its own, ``entered/rank{R}.jsonl``
(so ``rank{R}.jsonl`` stays one record per finished call for every program that reads it). A
finished record of the same id pairs with it; an open record without one is a call that was in
flight when the rank stopped (trace/hang.py). Ids count the calls of one rank as they *begin*, so a
caller's id is always smaller than its callees': that one rule makes the parent links a forest
(no cycle can be written), and it is what the reader checks. ``parent`` is ``ROOT`` (JSON null)
for a call nobody traced called.
"""

from __future__ import annotations

import re

RANK_FILE = re.compile(r"rank(0|[1-9]\d*)\.jsonl")  # as rank_file_name writes it: rank07 is no rank's
ROOT = None  # the parent of an outermost call
DIST = "torch.distributed."  # the prefix of every wrapped torch.distributed call's name
NEW_GROUP = DIST + "new_group"
# The fake launcher's record of a played rank, the last of its file (launcher/fake.py): the world,
# the ranks played ("all", or the chosen few: a partial trace), and the new_group calls of groups
# without this rank, answered unrecorded, counted per group description.
PLAYED = "minitron.launcher.fake.play_rank"

# Which clock a trace's times read. The host's clock alone times a GPU step's launch, not its
# work (kernels run after the call returns), so a recorder that waits for the device at each
# call's start and end first writes one record of this name: a trace without it, every trace of
# a CPU run and every trace written before it existed, reads host time.
CLOCK = "minitron.trace.recorder.device_sync"
HOST_TIME, GPU_TIME = "host time", "GPU time (synchronized)"

# field -> (the Python types its JSON value may have, exactly: JSON's true is a bool, which
# Python counts as an int, and is no rank, id or time), what the reader says it must be.
FIELDS = {
    "rank": ((int,), "a rank number"),
    "pid": ((int,), "a process id"),
    "id": ((int,), "a call number"),
    "parent": ((int, type(ROOT)), "the caller's id or null"),
    "name": ((str,), "a qualified name"),
    "args": ((dict,), "an object of arguments"),
    "start_us": ((int, float), "a time in microseconds"),
    "end_us": ((int, float), "a time in microseconds"),
}
OPTIONAL = {"error": ((str,), "the exception's text")}
OPEN = "open"   # the key that marks an open record (its value: true)
ENTERED_DIR = "entered"   # where the open records go: DIR/entered/rank{R}.jsonl

# Bounds that keep reading a file of any content finite. The recorder shortens every argument
# (recorder.short_value): its longest lines, the run's validated arguments, are ~20 KiB and nest
# four levels deep. A traced iteration nests ~15 calls deep; the views walk a call tree by
# recursion, and 100 levels keep them far from Python's limit of 1000 frames.
MAX_LINE_BYTES = 1 << 20
# Times are microseconds since 1970 (~2**50 now). Perfetto reads JSON numbers as doubles, exact
# up to 2**53 (the year 2255); past that a time is no longer the one recorded.
MAX_TIME_US = 1 << 53
# The views check a rank's groups from its own digits (rank_generator.rank_layout), but a few
# things still grow with the world (one group kind is the whole world; the order check walks
# the pipeline groups): 131,072 ranks, the most a fake world plays (`trace --ranks`), is as far
# as a trace may claim, well beyond the largest published Megatron runs.
MAX_WORLD = 1 << 17
MAX_ARGS_DEPTH = 16
MAX_CALL_DEPTH = 100


def rank_file_name(rank: int) -> str:
    return f"rank{rank}.jsonl"


def new_record(rank: int, pid: int, call_id: int, parent: int | None, name: str, args: dict,
               start_us: int, end_us: int) -> dict:
    """One call's record, as the recorder writes it (its keys are FIELDS, in that order)."""
    return {"rank": rank, "pid": pid, "id": call_id, "parent": parent, "name": name, "args": args,
            "start_us": start_us, "end_us": end_us}


def new_open_record(rank: int, pid: int, call_id: int, parent: int | None, name: str, args: dict,
                    start_us: int) -> dict:
    """A call's record as it begins: FIELDS less end_us, marked OPEN."""
    return {"rank": rank, "pid": pid, "id": call_id, "parent": parent, "name": name, "args": args,
            "start_us": start_us, OPEN: True}
