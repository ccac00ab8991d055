"""save / load: a sharded state dict to and from a directory, through PyTorch's DCP.

A torch_dist checkpoint directory (Megatron's layout)::

    iter_0000040/
        .metadata            DCP's: every global tensor, its chunks, which file holds each
        __0_0.distcp ...     one file per writing rank: that rank's main-replica chunks, then
                             (minitron's) its owner record, which DCP never reads (file_owner.py)
        common.pt            what is not sharded (iteration, scheduler, args): rank 0's
        metadata.json        {"sharded_backend": "torch_dist", ...}: which reader to use

Every rank calls save and load (they are collectives: DCP's planning gathers to rank 0).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner

from minitron.core.dist_checkpointing.earlier_keys import read_earlier_keys
from minitron.core.dist_checkpointing.file_owner import append_file_owner
from minitron.core.dist_checkpointing.mapping import (
    CheckpointingException, ShardedObject, ShardedTensor, apply_factories, apply_factory_merges, is_main_replica,
    leaves, map_leaves,
)
from minitron.core.dist_checkpointing.torch_dist import LocalChunks, WeightsOnlyLoadPlanner

COMMON = "common.pt"
CONFIG = "metadata.json"
BACKEND = {"sharded_backend": "torch_dist", "sharded_backend_version": 1, "common_backend": "torch"}


def _global_chunk(sh: ShardedTensor, data: torch.Tensor):
    """The chunk as DCP sees it: data with the prepended axes made real (views, no copy)."""
    return sh.global_offset, data.reshape((1,) * sh.prepend_axis_num + sh.local_shape)


def _to_dcp(sharded_state_dict, saving: bool, saved_sizes: dict | None = None) -> dict:
    """Flatten to DCP's {key: value}: one LocalChunks per tensor key, one bytes item per object.

    Saving keeps only main replicas (each chunk written once); loading keeps every chunk, since
    every rank needs its whole state. ``saved_sizes`` (loading): the global shapes in the
    checkpoint, for tensors that may have changed shape (allow_shape_mismatch)."""
    chunks, shapes, dtypes, flat = defaultdict(list), {}, {}, {}
    for sh in leaves(sharded_state_dict):
        if isinstance(sh, ShardedObject):
            if not saving or is_main_replica(sh.replica_id):
                flat[sh.unique_key] = sh.data if saving else None   # DCP torch.saves a non-tensor
            continue
        if not isinstance(sh, ShardedTensor):
            continue
        if shapes.setdefault(sh.key, sh.global_shape) != sh.global_shape:
            raise CheckpointingException(f"{sh.key}: two pieces disagree on the global shape "
                                         f"({shapes[sh.key]} and {sh.global_shape})")
        dtypes[sh.key] = sh.dtype
        if saving and not is_main_replica(sh.replica_id):
            continue
        if sh.data.numel() == 0:
            # No element here (FSDP2's rows of a piece this rank holds none of): nothing to write
            # or read, and DCP would pair an empty chunk with a stored one at its offset.
            continue
        offset, data = _global_chunk(sh, sh.data)
        saved = (saved_sizes or {}).get(sh.key)
        if saved is not None and tuple(saved) != sh.global_shape and sh.allow_shape_mismatch:
            # The padded vocabulary changed: read what overlaps, leave the rest zero.
            sh.data.zero_()
            shapes[sh.key] = tuple(saved)
            for axis, (o, n, s) in enumerate(zip(offset, data.shape, saved)):
                data = data.narrow(axis, 0, max(0, min(n, s - o)))
            if data.numel() == 0:
                continue
        chunks[sh.key].append((offset, data))
    for key in shapes:
        flat[key] = LocalChunks(shapes[key], dtypes[key], chunks.get(key, []))
    return flat


def save(sharded_state_dict, checkpoint_dir, common_state_dict: dict | None = None,
         owner: dict | None = None) -> None:
    """Write this rank's main-replica chunks; rank 0 also writes common.pt and metadata.json.
    ``owner``, if given, is appended to this rank's .distcp file as whose it is (file_owner.py)."""
    checkpoint_dir = Path(checkpoint_dir)
    flat = _to_dcp(apply_factories(sharded_state_dict), saving=True)
    # flatten_state_dict=False: our dict is flat already, and an object (a dict of RNG states)
    # must stay one value under its key, not be taken apart into one entry per field.
    dcp.save(flat, storage_writer=dcp.FileSystemWriter(checkpoint_dir, thread_count=1),
             planner=DefaultSavePlanner(flatten_state_dict=False))
    if owner is not None:
        # thread_count=1: one file per rank, named by DCP after the rank (file_owner.writer_rank).
        for path in checkpoint_dir.glob(f"__{torch.distributed.get_rank()}_*.distcp"):
            append_file_owner(path, owner)
    if torch.distributed.get_rank() == 0:
        torch.save(common_state_dict or {}, checkpoint_dir / COMMON)
        (checkpoint_dir / CONFIG).write_text(json.dumps(BACKEND))
    torch.distributed.barrier()


def read_dcp_metadata(checkpoint_dir):
    """DCP's .metadata: every key, its global size, its chunks and where each was stored."""
    return dcp.FileSystemReader(checkpoint_dir).read_metadata()


def load_common_state_dict(checkpoint_dir) -> dict:
    # Onto the host, wherever it was written: counters, the schedule, the scaler's scale.
    return torch.load(Path(checkpoint_dir) / COMMON, map_location="cpu", weights_only=True)


def load(sharded_state_dict, checkpoint_dir, strict: bool = True, bytes_read: dict | None = None):
    """Read every piece ``sharded_state_dict`` describes into its data; return the same tree
    with each ShardedTensor replaced by its (loaded) tensor, each ShardedObject by its value
    and each factory by its merged tensor. ``strict``: a key the checkpoint lacks is an error.
    ``bytes_read``, if given, is filled with {file: bytes this rank read from it}.
    """
    checkpoint_dir = Path(checkpoint_dir)
    meta = read_dcp_metadata(checkpoint_dir)
    saved_sizes = {k: tuple(md.size) for k, md in meta.state_dict_metadata.items() if hasattr(md, "size")}
    built = read_earlier_keys(apply_factories(sharded_state_dict), meta.state_dict_metadata)   # MoE's old names
    missing = sorted({sh.unique_key if isinstance(sh, ShardedObject) else sh.key for sh in leaves(built)
                      if isinstance(sh, (ShardedTensor, ShardedObject))} - set(meta.state_dict_metadata))
    if missing and strict:
        raise CheckpointingException(f"{checkpoint_dir} lacks {len(missing)} of the keys this model needs "
                                     f"(first: {missing[0]}): it was saved from another model")
    built = map_leaves(lambda x: None if isinstance(x, (ShardedTensor, ShardedObject)) and
                       (x.unique_key if isinstance(x, ShardedObject) else x.key) in missing else x, built)
    flat = _to_dcp(built, saving=False, saved_sizes=saved_sizes)
    planner = WeightsOnlyLoadPlanner(flatten_state_dict=False)
    dcp.load(flat, storage_reader=dcp.FileSystemReader(checkpoint_dir), planner=planner)
    if bytes_read is not None:
        bytes_read.update(planner.bytes_read())

    def unwrap(x):
        if isinstance(x, ShardedTensor):
            return x.data
        if isinstance(x, ShardedObject):
            return planner.objects[x.unique_key]
        return x
    return apply_factory_merges(map_leaves(unwrap, built), sharded_state_dict)
