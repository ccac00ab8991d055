"""--ckpt-format torch_dist: Megatron's sharded checkpoint, readable by any layout.

    SAVE/latest_checkpointed_iteration.txt   "40", moved last, atomically (as the legacy format)
    SAVE/iter_0000040/                        written as iter_0000040.tmp/, renamed when whole
        .metadata, __<rank>_0.distcp          DCP: every global tensor's chunks, one file per rank,
                                              each signed by its writer (dist_checkpointing/file_owner.py)
        common.pt                             iteration, scheduler, optimizer's step, args
        metadata.json                         Megatron's backend line + the writing layout and
                                              each file's size and sha256 (checkpoint_files.py)

What each rank puts in: its model chunks' sharded state dicts (global keys, so a layer is
``decoder.layers.*`` slice ``layer_number - 1`` at any pp / vp), the optimizer's moments and
fp32 main params shaped like the parameters (core/dist_checkpointing/optimizer.py), and its
RNG states as one cell of a (pp, tp, dp) grid of objects. Loading asks for the pieces the
*loading* layout needs; the RNG cells only mean something at the layout that wrote them, so
another layout starts its random streams from the seed (and says so), as Megatron does.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from minitron.core import dist_checkpointing
from minitron.core import parallel_state as mpu
from minitron.core.dist_checkpointing import ShardedObject
from minitron.core.dist_checkpointing.optimizer import (
    optimizer_sharded_state_dict, restore_optimizer_state, state_names,
)
from minitron.core.dist_checkpointing.serialization import BACKEND, CONFIG, load_common_state_dict, read_dcp_metadata
from minitron.runtime.checkpoint.shard_owner import owner
from minitron.training.checkpoint_files import (
    LAYOUT_KEYS, CheckpointError, args_snapshot, file_digest, iteration_dir,
)
from minitron.training.checkpoint_retain import write_tracker
from minitron.training.utils import print_rank_0

def _layout_cell() -> tuple[tuple[int, ...], tuple[int, ...]]:
    """This rank's place in the (pp, tp, dp) grid, and the grid's shape."""
    return ((mpu.get_pipeline_model_parallel_rank(), mpu.get_tensor_model_parallel_rank(),
             mpu.get_data_parallel_rank(with_context_parallel=True)),
            (mpu.get_pipeline_model_parallel_world_size(), mpu.get_tensor_model_parallel_world_size(),
             mpu.get_data_parallel_world_size(with_context_parallel=True)))


def _file_owner() -> dict:
    """Whose .distcp file this rank writes: its global rank (the rank in the file's name) and
    its place in the saving layout, so that a refusal can say which shard sits where."""
    record = owner(mpu.get_tensor_model_parallel_rank(), mpu.get_tensor_model_parallel_world_size(),
                   mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size(),
                   mpu.get_expert_model_parallel_rank(), mpu.get_expert_model_parallel_world_size(),
                   mpu.get_data_parallel_rank(), mpu.get_data_parallel_world_size())
    return dict(record, rank=torch.distributed.get_rank(), world_size=torch.distributed.get_world_size(),
                context_parallel_rank=mpu.get_context_parallel_rank(),
                context_parallel_size=mpu.get_context_parallel_world_size())


def _model_sharded(model) -> dict:
    return {f"model{i}": chunk.sharded_state_dict() for i, chunk in enumerate(model)}


def _rng_object(state) -> ShardedObject:
    offset, shape = _layout_cell()
    return ShardedObject("rng_state", state, shape, offset, replica_id=0)


def save_checkpoint_dist(iteration: int, model, optimizer, opt_param_scheduler, args, rng_state) -> None:
    sharded = {"model": _model_sharded(model), "rng_state": _rng_object(rng_state)}
    names = state_names(optimizer)
    described = optimizer_sharded_state_dict(optimizer, sharded["model"], names, loading=False)
    sharded["optimizer"] = {key: entry[0] for key, entry in described.items()}
    save_checkpoint_dist_common(iteration, sharded, names, optimizer, opt_param_scheduler, args)


def save_checkpoint_dist_common(iteration: int, sharded: dict, names: list, optimizer, opt_param_scheduler, args,
                                backend: str = "torch_dist") -> None:
    """Write ``sharded`` through DCP with common.pt and metadata.json, the directory appearing
    whole (fsdp_dtensor, checkpointing_fsdp_dtensor.py, writes its own ``sharded`` so)."""
    final = iteration_dir(args.save, iteration)
    tmp = final.with_name(final.name + ".tmp")
    if torch.distributed.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)   # the remains of a save that was killed
        tmp.mkdir(parents=True)
    torch.distributed.barrier()
    step = next((float(s["step"]) for s in optimizer.optimizer.state.values() if "step" in s), None)
    common = {"iteration": iteration, "checkpoint_version": 3.0, "args": args_snapshot(args),
              "consumed_train_samples": args.consumed_train_samples,
              "opt_param_scheduler": opt_param_scheduler.state_dict(),
              "optimizer": {"state_names": names, "step": step,
                            "param_groups": [{k: v for k, v in g.items() if k != "params"}
                                             for g in optimizer.optimizer.param_groups],
                            "grad_scaler": optimizer.grad_scaler.state_dict()
                            if getattr(optimizer, "grad_scaler", None) is not None else None}}
    dist_checkpointing.save(sharded, tmp, common, owner=_file_owner())
    if torch.distributed.get_rank() == 0:
        meta = dict(BACKEND, sharded_backend=backend, iteration=iteration, world_size=args.world_size,
                    data_parallel_size=args.data_parallel_size, **{k: getattr(args, k) for k in LAYOUT_KEYS})
        meta["files"] = {p.name: {"bytes": p.stat().st_size, "sha256": file_digest(p)}
                         for p in sorted(tmp.iterdir()) if p.name != CONFIG}
        (tmp / CONFIG).write_text(json.dumps(meta, indent=1))
        shutil.rmtree(final, ignore_errors=True)     # an older save of this same iteration
        os.replace(tmp, final)                       # the directory appears whole, or not at all
        write_tracker(args.save, iteration, getattr(args, "save_retain_interval", None))   # then older ones go
    torch.distributed.barrier()
    print_rank_0(f"> saved checkpoint at iteration {iteration} to {args.save} ({backend})")


def load_checkpoint_dist(where: Path, model, optimizer, opt_param_scheduler, args):
    """Load into this layout; return (the saving run's args, this rank's saved RNG state or None)."""
    common = load_common_state_dict(where)
    sharded = {"model": _model_sharded(model)}
    # The RNG cells fit only the (pp, tp, dp) grid that wrote them: is this rank's cell there?
    load_rng = not args.no_load_rng and _rng_object(None).unique_key in read_dcp_metadata(where).state_dict_metadata
    if load_rng:
        sharded["rng_state"] = _rng_object(None)
    described = {}
    if not args.no_load_optim and common["optimizer"]["state_names"] is not None:
        described = optimizer_sharded_state_dict(optimizer, sharded["model"], common["optimizer"]["state_names"],
                                                 loading=True)
        sharded["optimizer"] = {key: entry[0] for key, entry in described.items()}
    try:
        loaded = dist_checkpointing.load(sharded, where)
    except dist_checkpointing.CheckpointingException as exc:
        raise CheckpointError(str(exc)) from None
    if args.no_load_optim:
        optimizer.reload_model_params()   # the fp32 main params from the weights just read
    else:
        restore_optimizer_state(optimizer, loaded.get("optimizer", {}), described, common["optimizer"]["step"])
    restore_common(args, optimizer, opt_param_scheduler, common, load_rng)
    return common["args"], loaded.get("rng_state")


def restore_common(args, optimizer, opt_param_scheduler, common: dict, load_rng: bool) -> None:
    """What both sharded formats (torch_dist, fsdp_dtensor) keep in their common file, once the
    tensors are back: the optimizer's groups, loss scaler and schedule (unless --no-load-optim),
    the samples consumed, and a word when the random states do not fit this layout."""
    if not args.no_load_optim:
        saved = common["optimizer"]
        for group, saved_group in zip(optimizer.optimizer.param_groups, saved["param_groups"]):
            group.update(saved_group)
        if saved["grad_scaler"] is not None and getattr(optimizer, "grad_scaler", None) is not None:
            optimizer.grad_scaler.load_state_dict(saved["grad_scaler"])
        opt_param_scheduler.load_state_dict(common["opt_param_scheduler"])
    if not load_rng and not args.no_load_rng:
        print_rank_0("> the checkpoint was written by another layout: its random states do not fit this one, "
                     "the streams start from --seed (Megatron does the same)")
    args.consumed_train_samples = common["consumed_train_samples"]
