"""A checkpoint's files, read without torch: the latest-iteration marker, metadata.json, and
the checksum of every shard.

The launching process runs ``check_resumable`` (checkpoint_resume.py) before any rank starts
(validate_args calls it) on what this module reads, so every way a ``--load`` can be wrong — a file instead of a folder, a damaged marker,
a different model, a shard cut short or with one flipped byte — is one line naming the file
or the flag, not a raw torch error from each of 8 ranks. That is why this module imports
no torch until its very last check (would a weights-only torch.load take each shard?): every
other refusal costs milliseconds plus one read of the shards.

Why a checksum: torch.load reads tensor bytes as they are. A flipped bit inside a weight
loads without complaint and training continues with different numbers. So every file a save
writes is hashed (sha256) as it is written, and metadata.json, which moves into place last,
records each file's size and digest.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import zipfile
from pathlib import Path

TRACKER = "latest_checkpointed_iteration.txt"
METADATA = "metadata.json"
# What must match to resume: the layout (each rank reads the files of its own (tp, pp) slice)
# and every flag that sets a tensor's shape or the optimizer's structure. A key missing from
# an older checkpoint's metadata is not compared.
LAYOUT_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers", "hidden_size",
               "num_attention_heads", "ffn_hidden_size", "kv_channels", "seq_length",
               "max_position_embeddings", "untie_embeddings_and_output_weights", "tokenizer_type",
               "vocab_size", "make_vocab_size_divisible_by", "virtual_pipeline_model_parallel_size",
               "use_distributed_optimizer", "params_dtype", "num_experts",
               "expert_model_parallel_size", "expert_tensor_parallel_size", "moe_ffn_hidden_size", "moe_layer_freq",
               # the modern GPT options: each changes a tensor's shape or what it means
               "position_embedding_type", "swiglu", "normalization", "group_query_attention",
               "num_query_groups")


# What a torch_dist checkpoint lets change on resume: the layout (each rank reads its own pieces).
RESHARDABLE = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
               "use_distributed_optimizer", "expert_model_parallel_size", "expert_tensor_parallel_size")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed here; the message says why and what would fix it."""


def args_snapshot(args) -> dict:
    """The run's arguments as plain data (numbers, strings, lists of them): what a weights-only
    load accepts."""
    keep = (int, float, str, bool, type(None))
    return {k: v for k, v in vars(args).items()
            if isinstance(v, keep) or (isinstance(v, list) and all(isinstance(x, keep) for x in v))}


def atomic_write_text(text: str, path: Path) -> None:
    """Write under a temporary name, then rename: a reader sees the old text or the new, whole."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def iteration_dir(root, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


def rank_dir(root, iteration: int, tp_rank: int, pp_rank: int, pp_size: int, ep_rank: int = 0,
             ep_size: int = 1) -> Path:
    name = f"mp_rank_{tp_rank:02d}" if pp_size == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    if ep_size > 1:   # MoE: each expert-parallel rank holds other experts (Megatron's _EEE suffix)
        name += f"_{ep_rank:03d}"
    return iteration_dir(root, iteration) / name


def file_digest(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _read_text(path: Path, what: str) -> str:
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError as exc:
        raise CheckpointError(f"{path}: byte {exc.start} is not UTF-8 text; the {what} is damaged") from None
    except IsADirectoryError:
        raise CheckpointError(f"{path} is a directory; it should be the {what}, a file") from None
    except OSError as exc:
        raise CheckpointError(f"cannot read {path} ({exc.strerror})") from None


def read_latest_iteration(root) -> int | None:
    root = Path(root)
    if root.exists() and not root.is_dir():
        raise CheckpointError(f"--load {root} is a file: give the directory a --save wrote (it holds {TRACKER})")
    marker = root / TRACKER
    if not marker.exists():
        return None
    text = _read_text(marker, "latest-iteration marker").strip()
    if not text.isdigit():
        raise CheckpointError(f"{marker} should hold an iteration number, found {text[:40]!r}")
    return int(text)


def read_metadata(root, iteration: int) -> dict:
    path = iteration_dir(root, iteration) / METADATA
    if not path.exists():
        raise CheckpointError(f"--load {root}: iteration {iteration} has no {METADATA}; "
                              "the checkpoint is incomplete or not minitron's")
    try:
        meta = json.loads(_read_text(path, "checkpoint's metadata"))
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path} is not valid JSON ({exc.msg} at line {exc.lineno}): "
                              f"it was cut short or damaged") from None
    if not isinstance(meta, dict):
        raise CheckpointError(f"{path} holds a JSON {type(meta).__name__}, not the checkpoint's metadata")
    check_metadata(meta, path)
    return meta


# What the checks below read of metadata.json, and the type each must have (the rest, the model's
# flags, is only compared with this run's values, which works for any JSON value).
COUNTS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "data_parallel_size")
_SHA256 = re.compile(r"[0-9a-f]{64}")
_SHARD = re.compile(r"mp_rank_\d{2}(_\d{3}){0,2}/[A-Za-z0-9_.]+\.pt|__\d+_\d+\.distcp|\.metadata|common\.pt")


def check_metadata(meta: dict, path: Path) -> None:
    """metadata.json as a schema: each file's entry {bytes, sha256} under a rank folder of this
    iteration, the sizes of the layout whole numbers. A damaged or foreign file is refused here
    in one line, not as a TypeError on every rank."""
    def bad(what: str):
        return CheckpointError(f"{path}: {what}; the metadata is damaged or not minitron's: resume from "
                               "another checkpoint")

    for key in COUNTS:
        value = meta.get(key, 1)
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20:
            raise bad(f"{key} is {json.dumps(value)[:40]}, not a whole number from 1")
    if not isinstance(meta.get("use_distributed_optimizer", False), bool):
        raise bad("use_distributed_optimizer is not true or false")
    if "files" not in meta:
        return  # a checkpoint from before checksums
    files = meta["files"]
    if not isinstance(files, dict):
        raise bad(f"\"files\" is a JSON {_json_kind(files)}, not an object of file -> {{bytes, sha256}}")
    for rel, info in files.items():
        if not _SHARD.fullmatch(rel):  # no '..', no absolute path: only files of this iteration
            raise bad(f"\"files\" names {rel[:60]!r}, not a shard such as mp_rank_00/model_optim_rng.pt")
        if not isinstance(info, dict):
            raise bad(f"the entry of {rel} is a JSON {_json_kind(info)}, not {{bytes, sha256}}")
        size, digest = info.get("bytes"), info.get("sha256")
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise bad(f"the entry of {rel} has no byte count (\"bytes\": {json.dumps(size)[:20]})")
        if not isinstance(digest, str) or not _SHA256.fullmatch(digest):
            raise bad(f"the entry of {rel} has no sha256 (64 hex digits)")


def _json_kind(value) -> str:
    return {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}.get(
        type(value), "number")


def verify_file(path: Path, meta: dict, rel: str | None = None) -> None:
    """Is ``path`` the file the save wrote? Size and sha256 against metadata.json; a checkpoint
    from before checksums gets the weaker test that it is a whole torch (zip) file. ``rel``:
    its name in metadata.json (a torch_dist file, whose bytes are DCP's, not a torch zip)."""
    if not path.is_file():
        raise CheckpointError(f"{path} is missing: was the checkpoint saved with this tp/pp layout?")
    sharded, rel = rel is not None, rel or path.relative_to(path.parent.parent).as_posix()
    info = meta.get("files", {}).get(rel)
    size = path.stat().st_size
    if info is None:
        check_torch_file(path, size)
        return
    if size != info["bytes"]:
        raise CheckpointError(f"{path} is {size} bytes, the save wrote {info['bytes']}: it was cut short "
                              f"or changed; resume from another checkpoint")
    if file_digest(path) != info["sha256"]:
        raise CheckpointError(f"{path} does not match the sha256 saved with the checkpoint: its bytes "
                              f"changed since the save; resume from another checkpoint")
    if not sharded:
        check_torch_file(path, size)  # the metadata may vouch for a foreign file: its own checksum


def check_torch_file(path: Path, size: int) -> None:
    """torch.save's format, read without torch: a zip archive holding ``<name>/data.pkl``."""
    if size == 0:
        raise CheckpointError(f"{path} is empty, not a torch checkpoint file: resume from another checkpoint")
    try:
        with zipfile.ZipFile(path) as archive:
            has_pickle = any(name.endswith("/data.pkl") for name in archive.namelist())
    except (zipfile.BadZipFile, OSError):
        has_pickle = False
    if not has_pickle:
        raise CheckpointError(f"{path} is not a torch checkpoint file (torch.save writes a zip archive with a "
                              f"data.pkl; cut short or damaged?): resume from another checkpoint")


def check_loadable(path: Path) -> None:
    """Would ``torch.load(weights_only=True)`` take the file? Its pickle may name classes that a
    weights-only load refuses (a checkpoint of another program, or a planted one). mmap: the
    pickle is read, the tensors' bytes are only mapped, so this costs little for any size."""
    import torch  # lazy: the checks above are torch-free, and the launcher refuses them first

    try:
        torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except Exception as exc:  # noqa: BLE001 -- whatever torch says, one line naming the file
        raise CheckpointError(load_problem(path, exc)) from None


def load_problem(path: Path, exc: Exception) -> str:
    """torch.load's error as one line: its message runs to several, with advice on loading the
    file unsafely that minitron will not follow."""
    text = str(exc)
    found = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if found:
        return (f"{path} holds a pickle that torch.load(weights_only=True) refuses (it names {found.group(1)}, "
                f"not tensors and plain containers); minitron loads checkpoints as data only: resume from "
                f"one minitron saved")
    first = next((line.strip() for line in text.splitlines() if line.strip()), type(exc).__name__)
    return f"{path}: torch cannot load it ({first[:200]}); resume from another checkpoint"
