"""Can this run resume from ``--load``? Asked by the launching process before any rank starts
(validate_args calls check_resumable): the checkpoint's layout and model against this run's
flags, then every file the save wrote, through checkpoint_files.py (the legacy format's shards,
their checksums and owners) or checkpoint_files_dist.py (a torch_dist checkpoint's DCP files).
"""

from __future__ import annotations

import re
from pathlib import Path

from minitron.training.checkpoint_files import (
    LAYOUT_KEYS, RESHARDABLE, CheckpointError, check_loadable, iteration_dir, rank_dir, read_latest_iteration,
    read_metadata, verify_file,
)
from minitron.training.checkpoint_files_dist import check_sharded_files


def expected_files(root, iteration: int, meta: dict) -> list[Path]:
    if "files" in meta:
        return [iteration_dir(root, iteration) / rel for rel in sorted(meta["files"])]
    tp, pp = meta.get("tensor_model_parallel_size", 1), meta.get("pipeline_model_parallel_size", 1)
    dp = meta.get("data_parallel_size", 1)
    files = []
    for t in range(tp):
        for p in range(pp):
            where = rank_dir(root, iteration, t, p, pp)   # (a checkpoint from before MoE: no ep)
            files.append(where / "model_optim_rng.pt")
            if meta.get("use_distributed_optimizer"):
                files += [where / f"distrib_optim_dp{d:03d}.pt" for d in range(dp)]
    return files


def check_owners(root, iteration: int, meta: dict, files: list[Path]) -> None:
    """Each shard's owner record (runtime/checkpoint/shard_owner.py) against the folder and name it
    sits under: a file moved to another rank's folder, its checksum re-signed, is refused here."""
    from minitron.runtime.checkpoint.shard_owner import owner, owner_mismatch, read_owner   # torch-free

    tp, pp, ep = (meta.get(f"{k}_model_parallel_size") or 1 for k in ("tensor", "pipeline", "expert"))
    places = {rank_dir(root, iteration, t, p, pp, e, ep).name: owner(t, tp, p, pp, e, ep)
              for t in range(tp) for p in range(pp) for e in range(ep)}
    for path in files:
        expected = dict(places.get(path.parent.name, {}))
        dp = re.fullmatch(r"distrib_optim_dp(\d+)\.pt", path.name)
        if dp:
            expected["data_parallel_rank"] = int(dp.group(1))
        problem = owner_mismatch(path, read_owner(path), expected)
        if problem:
            raise CheckpointError(problem)


def _flag(key: str) -> str:
    """The flag that sets ``key``: the precision is the one key that --fp16/--bf16 decide."""
    return "the weights' dtype (--fp16/--bf16):" if key == "params_dtype" else "--" + key.replace("_", "-")


def check_resumable(args) -> None:
    """Run before any rank starts: does --load hold a whole checkpoint that fits this run?"""
    if getattr(args, "deepspeed", False):
        return   # the engine's layout, not this one: deepspeed_arguments.check_deepspeed_load checked it
    iteration = read_latest_iteration(args.load)
    if iteration is None:
        return  # Megatron's behaviour: nothing to load yet, start from scratch
    meta = read_metadata(args.load, iteration)
    sharded = meta.get("sharded_backend") == "torch_dist"
    fsdp_dtensor = meta.get("sharded_backend") == "fsdp_dtensor"
    if fsdp_dtensor != bool(getattr(args, "use_megatron_fsdp", False)):   # Megatron's rule: only FSDP's format
        raise CheckpointError(
            f"--load {args.load} (iteration {iteration}) is Megatron-FSDP's fsdp_dtensor checkpoint: add "
            "--use-megatron-fsdp to read it" if fsdp_dtensor else
            f"--load {args.load} (iteration {iteration}) is a {meta.get('sharded_backend') or 'torch'} checkpoint; "
            "Megatron-FSDP reads only --ckpt-format fsdp_dtensor: load it without --use-megatron-fsdp")
    differ = [(key, meta[key], getattr(args, key)) for key in LAYOUT_KEYS
              if key in meta and meta[key] != getattr(args, key) and not (sharded and key in RESHARDABLE)]
    if differ:
        said = "; ".join(f"{_flag(k)} {saved} in the checkpoint, {mine} here" for k, saved, mine in differ)
        raise CheckpointError(f"--load {args.load} (iteration {iteration}) was saved with another layout or "
                              f"model: {said}; resume with the checkpoint's values")
    if sharded or fsdp_dtensor:   # DCP's files either way
        return check_sharded_files(args.load, iteration, meta)   # the torch_dist half
    if args.use_distributed_optimizer and meta.get("data_parallel_size") != args.data_parallel_size:
        raise CheckpointError(f"--load {args.load}: distributed-optimizer shards were saved for "
                              f"{meta.get('data_parallel_size')} data-parallel ranks, this run has "
                              f"{args.data_parallel_size}")
    files = expected_files(args.load, iteration, meta)
    for path in files:
        verify_file(path, meta)
    check_owners(args.load, iteration, meta, files)
    # Last, as it imports torch: in the launching process (rank 0's view) or in rank 0 itself
    # under torchrun; the other ranks rely on it, rather than print the same line each.
    if getattr(args, "rank", 0) == 0:
        for path in files:
            check_loadable(path)
