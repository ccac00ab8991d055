"""Whose shard is this? Each per-rank checkpoint file records the rank that wrote it.

A legacy checkpoint (``mp_rank_01_002/model_optim_rng.pt``) and DeepSpeed's layout
(``zero_pp_rank_1_mp_rank_00_optim_states.pt``) tell ranks apart by file and folder names
alone. Move two files, and every check that looks at one file at a time passes: each is whole,
each is a torch file, and tensor ranks 0 and 1 of the same layer have the same shapes, so rank 0
would load rank 1's half of every weight and train on without a word. DeepSpeed records only
the world sizes in its files (``dp_world_size``, ``mp_world_size``), not the rank.

So every such file carries an owner record: the ranks its name stands for and the sizes of the
layout, as JSON, in the *comment* of the zip archive torch.save writes. Why there and not as a
key of the pickled dict: the comment sits in the file's last bytes, so the launching process
reads it without torch and without unpickling anything, before any rank starts; torch.load never
looks at it, so DeepSpeed's files keep exactly DeepSpeed's keys; and the checksums a legacy
save records cover it, since it is stamped before the file is hashed. A file without the record
(an older minitron's, or DeepSpeed's own) makes no claim and loads as before.

This module is torch-free: the launcher imports it.
"""

from __future__ import annotations

import json
import os
import re
import struct
import zipfile
from pathlib import Path

RECORD = "minitron_shard_owner"
# A zip archive ends with its end-of-central-directory record: 22 bytes, the last two the length
# of the archive comment that follows them (torch.save leaves it empty).
_EOCD, _EOCD_SIZE = b"PK\x05\x06", 22

# What an owner record may hold, in the order it is told.
_WORDS = (("tensor_model_parallel", "tensor rank"), ("pipeline_model_parallel", "pipeline rank"),
          ("expert_model_parallel", "expert rank"), ("data_parallel", "data-parallel rank"))


def owner(tp: int, tp_size: int, pp: int = 0, pp_size: int = 1, ep: int = 0, ep_size: int = 1,
          dp: int | None = None, dp_size: int | None = None) -> dict:
    """An owner record: ranks and sizes under Megatron's names (``tensor_model_parallel_rank``
    ...). The data-parallel rank only for files that one data-parallel rank owns."""
    record = {"tensor_model_parallel_rank": tp, "tensor_model_parallel_size": tp_size,
              "pipeline_model_parallel_rank": pp, "pipeline_model_parallel_size": pp_size,
              "expert_model_parallel_rank": ep, "expert_model_parallel_size": ep_size}
    if dp is not None:
        record["data_parallel_rank"] = dp
    if dp_size is not None:
        record["data_parallel_size"] = dp_size
    return record


def stamp_owner(path, record: dict) -> None:
    """Write ``record`` as the archive comment of the torch file at ``path`` (just saved)."""
    comment = json.dumps({RECORD: record}, sort_keys=True).encode()
    with open(path, "r+b") as f:
        f.seek(-_EOCD_SIZE, os.SEEK_END)
        end = f.read(_EOCD_SIZE)
        if end[:4] != _EOCD or end[-2:] != b"\0\0":
            raise ValueError(f"{path} does not end as torch.save ends a file (a zip archive without a comment)")
        f.seek(-2, os.SEEK_END)
        f.write(struct.pack("<H", len(comment)) + comment)


def read_owner(path) -> dict | None:
    """The owner record of the file at ``path``, or None where it makes no claim (no record, not a
    zip archive: other checks name what is wrong with such a file)."""
    try:
        with zipfile.ZipFile(path) as archive:
            comment = archive.comment
        record = json.loads(comment.decode()).get(RECORD) if comment else None
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError, ValueError, AttributeError):
        return None
    return record if isinstance(record, dict) else None


def describe(record: dict) -> str:
    """'tensor rank 1 of 2, pipeline rank 0 of 2': the ranks a record holds, with their sizes; a
    dimension of size 1 is left out (every rank is its rank 0), unless nothing else is left."""
    parts, trivial = [], []
    for key, words in _WORDS:
        if f"{key}_rank" in record:
            rank, size = record[f"{key}_rank"], record.get(f"{key}_size")
            (trivial if (rank, size) == (0, 1) else parts).append(
                f"{words} {rank}" + (f" of {size}" if size is not None else ""))
    return ", ".join(parts or trivial[:1])


def owner_mismatch(path, found: dict | None, expected: dict, who: str = "") -> str | None:
    """None when ``found`` agrees with ``expected`` on every key both have (or makes no claim);
    else the one line that refuses the file. ``who``: the rank that would load it, at load time.
    Other sizes mean another layout wrote the file; the same sizes and another rank, a moved file."""
    if not found:
        return None
    shown = {k: v for k, v in expected.items() if k in found}
    where = f"{who}: " if who else ""
    sizes = [k for k in shown if k.endswith("_size") and found[k] != shown[k]]
    if sizes:
        said = ", ".join(f"{k.replace('_', '-')} {found[k]}" for k in sizes)
        return (f"{where}{path} was written by a run with {said}, not this run's "
                f"{', '.join(str(shown[k]) for k in sizes)}: resume with the layout it was saved with")
    if all(found[k] == v for k, v in shown.items()):
        return None
    return (f"{where}{path} holds the shard of {describe(found)}, but sits where the shard of {describe(shown)} "
            f"belongs: files were moved or renamed between ranks; put each back where the save wrote it, or resume "
            f"from another checkpoint")


# --- DeepSpeed's names: mp_rank_XX_model_states.pt, [bf16_]zero_pp_rank_D_mp_rank_XX_*_states.pt ----------

_DS_NAME = re.compile(r"(?:(?:bf16_)?zero_pp_rank_(?P<dp>\d+)_)?mp_rank_(?P<mp>\d+)_(?:model|optim)_states\.pt")


def deepspeed_owner_mismatch(where: Path, tp: int, dp: int) -> str | None:
    """Before any rank starts: each file of a DeepSpeed-layout tag against its name (the file set
    was already checked to be this run's, so the sizes are this run's tp and dp). On this path
    the pipeline size is 1, so DeepSpeed's model-parallel (mp) rank is the tensor rank."""
    for path in sorted(Path(where).glob("*.pt")):
        name = _DS_NAME.fullmatch(path.name)
        if name is None:
            continue
        dp_rank = int(name["dp"]) if name["dp"] is not None else None
        problem = owner_mismatch(path, read_owner(path), owner(int(name["mp"]), tp, dp=dp_rank, dp_size=dp))
        if problem:
            return problem
    return None
