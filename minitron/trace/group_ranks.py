"""A new_group record's ranks, written compactly when the group is large.

Written as a JSON list, the ranks of one group of a 131,072-rank world (the distributed
optimizer's instance group is the whole world) take ~800 KB: one line near the reader's 1 MiB
limit. Every group Megatron makes is a mixed-radix progression (rank_generator: the members count
up some digits of the rank, fastest first), so a long list is written as its first rank and
those digits instead, ``{"first": 0, "dims": [[size, stride], ...]}``, a few dozen bytes at any
world. The reader expands it back into the list (``expand_ranks``), so every view sees a list, as
in traces written before; a long list that is no such progression is written out as before.
"""

from __future__ import annotations

from minitron.trace.schema import NEW_GROUP

# Lists this short stay lists: readable in the file, and what every small trace has always held.
LIST_UP_TO = 64


def compact_ranks(ranks: list[int]):
    """``ranks`` as recorded: the list itself, or its progression when that is shorter."""
    if len(ranks) <= LIST_UP_TO:
        return ranks
    dims = _progression(ranks)
    return ranks if dims is None else {"first": ranks[0], "dims": dims}


def _progression(ranks: list[int]) -> list[list[int]] | None:
    """[[size, stride], ...], fastest first, such that the ranks are every first + sum(i_k *
    stride_k), 0 <= i_k < size_k, counted fastest first; None when they are not."""
    dims, items = [], ranks
    while len(items) > 1:
        stride = items[1] - items[0]
        size = 2
        while size < len(items) and items[size] - items[size - 1] == stride:
            size += 1
        if len(items) % size:
            return None
        block = items[:size]
        for start in range(size, len(items), size):
            shift = items[start] - items[0]
            if items[start:start + size] != [r + shift for r in block]:
                return None
        dims.append([size, stride])
        items = items[::size]   # each block's first rank: the slower digits, left to describe
    return dims


def expand_group(record: dict, limit: int) -> str | None:
    """A new_group record as read: its ranks, if written as a progression, made a list again (in
    place). Returns what is wrong with the progression, if anything."""
    if not (isinstance(record, dict) and record.get("name") == NEW_GROUP and isinstance(record.get("args"), dict)
            and isinstance(record["args"].get("ranks"), dict)):
        return None   # not one: the reader's own checks say what else is wrong with it
    ranks = record["args"]["ranks"]
    expanded = expand_ranks(ranks, limit)
    if isinstance(expanded, str):
        return expanded
    record["args"]["ranks"] = expanded
    return None


def expand_ranks(compact: dict, limit: int) -> list[int] | str:
    """The list a progression stands for, or what is wrong with it (a str) when it is not one
    of at most ``limit`` ranks."""
    first, dims = compact.get("first"), compact.get("dims")
    if set(compact) != {"first", "dims"} or not _whole(first) or not isinstance(dims, list):
        return 'ranks: an object that is not {"first": R, "dims": [[size, stride], ...]}'
    count = 1
    for dim in dims:
        if not (isinstance(dim, list) and len(dim) == 2 and all(map(_whole, dim)) and dim[0] >= 1):
            return f"ranks: {dim!r} is not a [size, stride] pair"
        count *= dim[0]
        if count > limit:
            return f"ranks: a group of more than {limit} ranks"
    out = [first]
    for size, stride in dims:   # a slower digit goes round the faster ones: the outer loop
        out = [r + i * stride for i in range(size) for r in out]
    return out


def _whole(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
