"""Save and resume: everything a run needs to continue exactly where it stopped.

Two formats, as in Megatron: ``--ckpt-format torch_dist`` (the default) writes global tensors
through torch.distributed.checkpoint and any layout resumes it (checkpointing_dist.py);
``--ckpt-format torch``, this file, is the legacy one. --load reads either (metadata.json says).

The legacy layout on disk (Megatron's names)::

    SAVE/latest_checkpointed_iteration.txt   "40" — written last, by rank 0, atomically
    SAVE/iter_0000040/metadata.json           layout, model shape, each file's size and sha256
    SAVE/iter_0000040/mp_rank_01_002/         tensor rank 1, pipeline rank 2 (no _PPP when pp = 1)
        model_optim_rng.pt                    model, optimizer, scheduler, RNG, progress
        distrib_optim_dp001.pt                with --use-distributed-optimizer: DP rank 1's shard

Every data-parallel replica holds the same model slice, so data-parallel rank 0 of each
(tp, pp) pair writes it; the distributed optimizer is the exception, each DP rank owning a
different shard (Megatron gathers the shards into one distrib_optim.pt; we keep one file per
shard and say so). Each file is written under a temporary name and renamed; the marker moves
only after every rank finished, so a save interrupted half-way leaves the previous
checkpoint intact and still the latest.

Before any rank starts, the launching process checks the whole checkpoint against this run
and against its checksums (checkpoint_files.py, torch-free). Loading then uses
``torch.load(weights_only=True)``: a checkpoint is data, and unpickling arbitrary objects
from a file would run arbitrary code. So everything saved is tensors, numbers,
strings and containers of them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch

from minitron.core import parallel_state as mpu
from minitron.runtime.checkpoint.constants import (UNIVERSAL_CHECKPOINT_INFO, UNIVERSAL_CHECKPOINT_VERSION_KEY,
                                                   UNIVERSAL_CHECKPOINT_VERSION_VALUE)
from minitron.runtime.checkpoint.shard_owner import owner, owner_mismatch, read_owner, stamp_owner
from minitron.trace import traced
from minitron.training.checkpoint_files import (  # noqa: F401 -- the torch-free half, re-exported
    LAYOUT_KEYS, METADATA, TRACKER, CheckpointError, args_snapshot, atomic_write_text,
    file_digest, iteration_dir, load_problem, rank_dir, read_latest_iteration, read_metadata, verify_file,
)
from minitron.training.checkpointing_rng import get_rng_state, set_rng_state
from minitron.training.global_vars import get_args
from minitron.training.utils import print_rank_0


def _restore_rng(state: dict, saved_args: dict, iteration: int) -> None:
    """This rank's saved random states; the checkpoint's seed reseeds what another kind of
    device saved (checkpointing_rng.py)."""
    args = get_args()
    set_rng_state(state, saved_args.get("seed", args.seed), iteration, args.data_parallel_random_init)


def _atomic_save(obj, path: Path, record: dict) -> dict:
    """Write under a temporary name, stamp whose it is (``record``, shard_owner.py), hash what
    landed on disk, rename. Returns the file's entry for metadata.json: its size and sha256,
    keyed by its path inside the iteration."""
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    stamp_owner(tmp, record)
    entry = {f"{path.parent.name}/{path.name}": {"bytes": tmp.stat().st_size, "sha256": file_digest(tmp)}}
    os.replace(tmp, path)
    return entry


def _rank_dir(root, iteration: int) -> Path:
    return rank_dir(root, iteration, mpu.get_tensor_model_parallel_rank(), mpu.get_pipeline_model_parallel_rank(),
                    mpu.get_pipeline_model_parallel_world_size(), mpu.get_expert_model_parallel_rank(),
                    mpu.get_expert_model_parallel_world_size())


def _owner(per_data_parallel_rank: bool = False) -> dict:
    """This rank's owner record: whose the (tp, pp, ep) folder is, and for a distributed-optimizer
    shard its data-parallel rank (context-parallel ranks counted in, as the file name counts them)."""
    dp = (mpu.get_data_parallel_rank(with_context_parallel=True),
          mpu.get_data_parallel_world_size(with_context_parallel=True)) if per_data_parallel_rank else (None, None)
    return owner(mpu.get_tensor_model_parallel_rank(), mpu.get_tensor_model_parallel_world_size(),
                 mpu.get_pipeline_model_parallel_rank(), mpu.get_pipeline_model_parallel_world_size(),
                 mpu.get_expert_model_parallel_rank(), mpu.get_expert_model_parallel_world_size(), *dp)


def _rng_states_of_data_parallel_ranks() -> list:
    """RNG states may differ across data-parallel ranks (--data-parallel-random-init): keep all.
    Context-parallel ranks count as data-parallel here: they hold the same weights, and the
    distributed optimizer shards over both (one file each, one writer of the model)."""
    rng_states = [None] * mpu.get_data_parallel_world_size(with_context_parallel=True)
    torch.distributed.all_gather_object(rng_states, get_rng_state(),
                                        group=mpu.get_data_parallel_group(with_context_parallel=True))
    return rng_states


def _write_tracker(root, iteration: int) -> None:
    from minitron.training.checkpoint_retain import write_tracker   # --save-retain-interval's removal too
    write_tracker(root, iteration, getattr(get_args(), "save_retain_interval", None))


@traced(args=lambda iteration, *a, **k: {"iteration": iteration})
def save_checkpoint(iteration: int, model, optimizer, opt_param_scheduler) -> None:
    args = get_args()
    if args.deepspeed:
        return _save_deepspeed(iteration, model[0])
    if args.ckpt_format == "fsdp_dtensor":   # Megatron-FSDP's shards, by parameter
        # lazy: torch.distributed.checkpoint costs 0.65 s of imports, paid by a run that saves
        from minitron.training.checkpointing_fsdp_dtensor import save_checkpoint_fsdp_dtensor
        return save_checkpoint_fsdp_dtensor(iteration, model, optimizer, opt_param_scheduler, args, get_rng_state())
    if args.ckpt_format == "torch_dist":
        # lazy: torch.distributed.checkpoint costs 0.65 s of imports, paid by a run that saves
        from minitron.training.checkpointing_dist import save_checkpoint_dist
        return save_checkpoint_dist(iteration, model, optimizer, opt_param_scheduler, args, get_rng_state())
    where = _rank_dir(args.save, iteration)
    rng_states = _rng_states_of_data_parallel_ranks()
    dp = mpu.get_data_parallel_rank(with_context_parallel=True)
    # MoE: data-parallel ranks hold different experts; the first of each expert-data-parallel
    # group writes its (tp, pp, ep) slice (validate_args keeps expert tp = tp when saving).
    writer = dp == 0 if mpu.get_expert_model_parallel_world_size() == 1 else \
        torch.distributed.get_rank() == mpu.get_global_ranks("expt-dp")[0]
    written = {}  # this rank's files -> size and sha256, for metadata.json
    if writer or args.use_distributed_optimizer:
        where.mkdir(parents=True, exist_ok=True)
    if writer:
        state = {"iteration": iteration, "checkpoint_version": 3.0, "args": args_snapshot(args),
                 "consumed_train_samples": args.consumed_train_samples,
                 "opt_param_scheduler": opt_param_scheduler.state_dict(), "rng_state": rng_states}
        for i, chunk in enumerate(model):
            state["model" if len(model) == 1 else f"model{i}"] = chunk.state_dict()
        if not args.use_distributed_optimizer:
            state["optimizer"] = optimizer.state_dict()
        written.update(_atomic_save(state, where / "model_optim_rng.pt", _owner()))
    if args.use_distributed_optimizer:
        written.update(_atomic_save(optimizer.state_dict(), where / f"distrib_optim_dp{dp:03d}.pt", _owner(True)))
    # Every file is in place before the marker moves; rank 0 learns every file's checksum.
    everyone = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(everyone, written)
    if torch.distributed.get_rank() == 0:
        meta = {k: getattr(args, k) for k in LAYOUT_KEYS}
        meta.update(iteration=iteration, data_parallel_size=args.data_parallel_size,
                    world_size=args.world_size, files=dict(sorted(kv for w in everyone for kv in w.items())))
        atomic_write_text(json.dumps(meta, indent=1), iteration_dir(args.save, iteration) / METADATA)
        _write_tracker(args.save, iteration)
    torch.distributed.barrier()
    print_rank_0(f"> saved checkpoint at iteration {iteration} to {args.save}")


def convert_checkpoint(model, optimizer, opt_param_scheduler) -> None:
    """--ckpt-convert-format F: save what --load just read in format F under
    --ckpt-convert-save/F (Megatron's place), at the same iteration; the run then stops."""
    args = get_args()
    if args.iteration == 0:
        print_rank_0(f"> --ckpt-convert-format: {args.load} holds no checkpoint, nothing to convert")
        return
    loaded_format = "torch_dist" if read_metadata(args.load, args.iteration).get("sharded_backend") else "torch"
    args.ckpt_format, args.save = args.ckpt_convert_format, os.path.join(args.ckpt_convert_save,
                                                                          args.ckpt_convert_format)
    save_checkpoint(args.iteration, model, optimizer, opt_param_scheduler)
    print_rank_0(f"> converted checkpoint: {loaded_format} -> {args.ckpt_format} ({args.save})")


def _load_verified(path: Path, meta: dict, record: dict):
    """The file, once its checksum and its owner record (this rank's ``record``, if it holds one)
    say it is the one this rank saved."""
    verify_file(path, meta)
    problem = owner_mismatch(path, read_owner(path), record, f"rank {torch.distributed.get_rank()}")
    if problem:
        raise CheckpointError(problem)
    try:
        # Onto the host, whichever device wrote the file (Megatron loads so too): the RNG states
        # must be CPU tensors, and load_state_dict copies the rest onto the model's own device.
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # noqa: BLE001 -- a file torch cannot read, named in one line
        raise CheckpointError(load_problem(path, exc)) from None


@traced
def load_checkpoint(model, optimizer, opt_param_scheduler) -> int:
    """Restore everything save_checkpoint wrote; return the iteration to continue from (0: none)."""
    args = get_args()
    if args.deepspeed:
        return _load_deepspeed(model[0])
    iteration = read_latest_iteration(args.load)
    if iteration is None:
        print_rank_0(f"> no checkpoint in {args.load}: starting from scratch")
        return 0
    # The launcher checked every file before starting us; under torchrun nobody did, so each
    # rank checks what it reads (sha256 against metadata.json) before torch sees a byte.
    meta = read_metadata(args.load, iteration)
    backend = meta.get("sharded_backend")
    if backend in ("torch_dist", "fsdp_dtensor"):   # the format is read from the checkpoint
        if backend == "torch_dist":
            # lazy: torch.distributed.checkpoint's 0.65 s of imports, paid by a run that loads
            from minitron.training.checkpointing_dist import load_checkpoint_dist as load_sharded
        else:
            # lazy: torch.distributed.checkpoint's 0.65 s of imports, paid by a run that loads
            from minitron.training.checkpointing_fsdp_dtensor import load_checkpoint_fsdp_dtensor as load_sharded
        saved_args, rng_state = load_sharded(iteration_dir(args.load, iteration), model, optimizer,
                                             opt_param_scheduler, args)
        if rng_state is not None:
            _restore_rng(rng_state, saved_args, iteration)
        print_rank_0(f"> loaded checkpoint from {args.load} at iteration {iteration} ({backend})")
        return _start_iteration(args, iteration)
    where = _rank_dir(args.load, iteration)
    state = _load_verified(where / "model_optim_rng.pt", meta, _owner())
    for i, chunk in enumerate(model):
        chunk.load_state_dict(state["model" if len(model) == 1 else f"model{i}"])
    if args.no_load_optim:
        optimizer.reload_model_params()   # Megatron's --no-load-optim: fresh moments, fp32 copies of these weights
    elif args.use_distributed_optimizer:
        shard = where / f"distrib_optim_dp{mpu.get_data_parallel_rank(with_context_parallel=True):03d}.pt"
        optimizer.load_state_dict(_load_verified(shard, meta, _owner(True)))
    else:
        optimizer.load_state_dict(state["optimizer"])
    if not args.no_load_optim:
        opt_param_scheduler.load_state_dict(state["opt_param_scheduler"])
    if not args.no_load_rng:
        _restore_rng(state["rng_state"][mpu.get_data_parallel_rank(with_context_parallel=True)], state["args"], iteration)
    args.consumed_train_samples = state["consumed_train_samples"]
    print_rank_0(f"> loaded checkpoint from {args.load} at iteration {iteration}")
    return _start_iteration(args, iteration)


def _start_iteration(args, iteration: int) -> int:
    """Megatron's --finetune: the weights of ``iteration`` (validate_args turned the optimizer's
    and the random states' loading off), but the run counts from iteration 0 and from the first
    sample, so its schedule and data order are a fresh run's."""
    if getattr(args, "finetune", False):
        print_rank_0(f"> --finetune: the weights of iteration {iteration}; training starts at iteration 0")
        args.consumed_train_samples = 0
        return 0
    return iteration


# --- pretrain --deepspeed: the engine's checkpoints, as Megatron-DeepSpeed wires them --------------
#
# The engine writes and reads model, optimizer partitions and schedule itself, in DeepSpeed's
# layout (minitron/runtime/checkpoint/): SAVE/latest names the tag, SAVE/global_step<N>/ holds
# the files. What only the training loop knows rides along as the engine's client state, stored
# in the model-states file and handed back by load_checkpoint: the iteration, the samples
# consumed (where the data resumes) and every data-parallel rank's RNG states. Megatron-DeepSpeed
# also writes Megatron's latest_checkpointed_iteration.txt beside DeepSpeed's ``latest``.

def _save_deepspeed(iteration: int, engine) -> None:
    args = get_args()
    client_state = {"iteration": iteration, "checkpoint_version": 3.0, "args": args_snapshot(args),
                    "consumed_train_samples": args.consumed_train_samples,
                    "rng_state": _rng_states_of_data_parallel_ranks(),
                    # What DeepSpeed's ds_to_universal asks of a client before converting (its
                    # version only: at tensor-parallel size 1 no slice needs a joining rule).
                    UNIVERSAL_CHECKPOINT_INFO: {UNIVERSAL_CHECKPOINT_VERSION_KEY: UNIVERSAL_CHECKPOINT_VERSION_VALUE}}
    engine.save_checkpoint(args.save, client_state=client_state)   # tag global_step<N>; every rank
    if torch.distributed.get_rank() == 0:
        _write_tracker(args.save, iteration)
    torch.distributed.barrier()
    print_rank_0(f"> saved checkpoint at iteration {iteration} to {args.save} (DeepSpeed's layout)")


def _load_deepspeed(engine) -> int:
    args = get_args()
    path, client_state = engine.load_checkpoint(args.load)
    if path is None:   # no 'latest': Megatron-DeepSpeed's behaviour, start from scratch
        print_rank_0(f"> no checkpoint in {args.load} (no 'latest'): starting from scratch")
        return 0
    states, dp_rank = client_state["rng_state"], mpu.get_data_parallel_rank(with_context_parallel=True)
    # A universal checkpoint may come from another data-parallel size, whose ranks' states do not
    # map onto ours. Unless --data-parallel-random-init, every data-parallel rank was seeded alike,
    # so rank 0's state is everyone's (the one Megatron's loader reads then).
    same_size = len(states) == mpu.get_data_parallel_world_size(with_context_parallel=True)
    _restore_rng(states[dp_rank] if same_size else states[0], client_state["args"], client_state["iteration"])
    args.consumed_train_samples = client_state["consumed_train_samples"]
    print_rank_0(f"> loaded checkpoint from {path} at iteration {client_state['iteration']}")
    return client_state["iteration"]
