"""Whose ``.distcp`` file is this? Each writer signs its own file after DCP's items.

DCP's ``.metadata`` says which file holds each chunk (``__2_0.distcp``, offset, length) and the
reader trusts the file to be what its name says. Two ranks whose items have the same sizes in
the same order (tensor ranks 1 and 2 at tp 4, two middle pipeline stages) write files that fit
each other's byte ranges exactly: swap them and every chunk loads, from the other rank.

So each rank appends an owner record to its file once DCP has written it: JSON, then its length
and a magic word, as the file's last bytes (the zip-comment record of the legacy format sits in
the same place, runtime/checkpoint/shard_owner.py). Why after the items and not as one more DCP
item: an item is a key of the checkpoint, and Megatron-Core's strict loads (``log_all``,
``raise_all``, ``return_all``) report every saved key its model does not ask for, so Megatron
would warn about, or refuse, a minitron checkpoint. DCP reads only the byte ranges ``.metadata``
names, so neither DCP nor Megatron ever sees the record; the launcher reads it without torch.
A file without it (an older minitron's, or Megatron's own) makes no claim.

This module is torch-free: the launcher's checks import it.
"""

from __future__ import annotations

import json
import os
import re
import struct

MAGIC = b"minitron-owner-1"
_LENGTH = struct.Struct("<I")
_TAIL = _LENGTH.size + len(MAGIC)
# DCP's FileSystemWriter names each writer's files __<rank>_<n>.distcp, rank in the saving group.
_NAME = re.compile(r"__(?P<rank>\d+)_\d+\.distcp")


def writer_rank(name: str) -> int | None:
    """__3_0.distcp -> 3: the rank whose items .metadata reads from this file (DCP's naming)."""
    found = _NAME.fullmatch(name)
    return int(found["rank"]) if found else None


def read_file_owner(path) -> tuple[dict | None, int]:
    """(the owner record or None, where DCP's items end: the record's first byte, else the size)."""
    size = os.path.getsize(path)
    if size < _TAIL:
        return None, size
    with open(path, "rb") as f:
        f.seek(size - _TAIL)
        tail = f.read(_TAIL)
        if tail[_LENGTH.size:] != MAGIC:
            return None, size
        (length,) = _LENGTH.unpack(tail[:_LENGTH.size])
        start = size - _TAIL - length
        if start < 0:
            return None, size
        f.seek(start)
        try:
            record = json.loads(f.read(length).decode())
        except (UnicodeDecodeError, ValueError):
            return None, size
    return (record, start) if isinstance(record, dict) else (None, size)


def append_file_owner(path, record: dict) -> None:
    """Sign the .distcp file at ``path`` (just written by DCP) with ``record``; once only, since a
    second record would hide the first."""
    if read_file_owner(path)[0] is not None:
        raise ValueError(f"{path} already ends with an owner record")
    body = json.dumps(record, sort_keys=True).encode()
    with open(path, "ab") as f:
        f.write(body + _LENGTH.pack(len(body)) + MAGIC)
