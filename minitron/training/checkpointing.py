"""Save and resume: everything a run needs to continue exactly where it stopped.

Layout on disk (Megatron's names)::

    SAVE/latest_checkpointed_iteration.txt   "40" — written last, by rank 0, atomically
    SAVE/iter_0000040/metadata.json           the layout and model shape, readable without torch
    SAVE/iter_0000040/mp_rank_01_002/         tensor rank 1, pipeline rank 2 (no _PPP when pp = 1)
        model_optim_rng.pt                    model, optimizer, scheduler, RNG, progress
        distrib_optim_dp001.pt                with --use-distributed-optimizer: DP rank 1's shard

Every data-parallel replica holds the same model slice, so data-parallel rank 0 of each
(tp, pp) pair writes it; the distributed optimizer is the exception, each DP rank owning a
different shard (Megatron gathers the shards into one distrib_optim.pt; we keep one file per
shard and say so). Each file is written under a temporary name and renamed; the marker moves
only after every rank finished, so a save interrupted half-way leaves the previous
checkpoint intact and still the latest.

Loading uses ``torch.load(weights_only=True)``: a checkpoint is data, and unpickling arbitrary
objects from a file would run arbitrary code. So everything saved is tensors, numbers,
strings and containers of them.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import numpy as np
import torch

from minitron.core import parallel_state as mpu
from minitron.core.tensor_parallel import get_cuda_rng_tracker
from minitron.trace import traced
from minitron.training.global_vars import get_args

TRACKER = "latest_checkpointed_iteration.txt"
LAYOUT_KEYS = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "num_layers", "hidden_size",
               "num_attention_heads", "ffn_hidden_size", "tokenizer_type", "vocab_size",
               "make_vocab_size_divisible_by", "virtual_pipeline_model_parallel_size", "use_distributed_optimizer")


class CheckpointError(ValueError):
    """A checkpoint that cannot be resumed here; the message says why and what would fix it."""


def iteration_dir(root, iteration: int) -> Path:
    return Path(root) / f"iter_{iteration:07d}"


def rank_dir(root, iteration: int, tp_rank: int, pp_rank: int, pp_size: int) -> Path:
    name = f"mp_rank_{tp_rank:02d}" if pp_size == 1 else f"mp_rank_{tp_rank:02d}_{pp_rank:03d}"
    return iteration_dir(root, iteration) / name


def read_latest_iteration(root) -> int | None:
    marker = Path(root) / TRACKER
    if not marker.exists():
        return None
    text = marker.read_text().strip()
    if not text.isdigit():
        raise CheckpointError(f"{marker} should hold an iteration number, found {text!r}")
    return int(text)


def check_resumable(args) -> None:
    """Run before any rank starts (validate_args): does --load fit this run's layout and model?"""
    iteration = read_latest_iteration(args.load)
    if iteration is None:
        return  # Megatron's behaviour: nothing to load yet, start from scratch
    meta_path = iteration_dir(args.load, iteration) / "metadata.json"
    if not meta_path.exists():
        raise CheckpointError(f"--load {args.load}: iteration {iteration} has no metadata.json; "
                              "the checkpoint is incomplete or not minitron's")
    saved = json.loads(meta_path.read_text())
    for key in LAYOUT_KEYS:
        mine = getattr(args, key, None)
        if key in saved and saved[key] != mine:
            raise CheckpointError(
                f"--load {args.load} (iteration {iteration}) was saved with {key.replace('_', '-')} "
                f"{saved[key]}, this run has {mine}: resume with the same layout and model")
    if args.use_distributed_optimizer and saved.get("data_parallel_size") != args.data_parallel_size:
        raise CheckpointError(f"--load {args.load}: distributed-optimizer shards were saved for "
                              f"{saved.get('data_parallel_size')} data-parallel ranks, this run has "
                              f"{args.data_parallel_size}")


def _rng_state() -> dict:
    name, keys, pos, has_gauss, gauss = np.random.get_state()
    return {"random": random.getstate(), "numpy": [name, keys.tolist(), pos, has_gauss, gauss],
            "torch": torch.get_rng_state(), "tracker": get_cuda_rng_tracker().get_states()}


def _set_rng_state(state: dict) -> None:
    random.setstate(state["random"])
    name, keys, pos, has_gauss, gauss = state["numpy"]
    np.random.set_state((name, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))
    torch.set_rng_state(state["torch"])
    get_cuda_rng_tracker().set_states(state["tracker"])


def _atomic_save(obj, path: Path) -> None:
    tmp = path.with_name(path.name + ".tmp")
    torch.save(obj, tmp)
    os.replace(tmp, path)


def _args_snapshot(args) -> dict:
    keep = (int, float, str, bool, type(None))
    return {k: v for k, v in vars(args).items()
            if isinstance(v, keep) or (isinstance(v, list) and all(isinstance(x, keep) for x in v))}


@traced(args=lambda iteration, *a, **k: {"iteration": iteration})
def save_checkpoint(iteration: int, model, optimizer, opt_param_scheduler) -> None:
    args = get_args()
    tp, pp = mpu.get_tensor_model_parallel_rank(), mpu.get_pipeline_model_parallel_rank()
    where = rank_dir(args.save, iteration, tp, pp, mpu.get_pipeline_model_parallel_world_size())
    # RNG states may differ across data-parallel ranks (--data-parallel-random-init): keep all.
    rng_states = [None] * mpu.get_data_parallel_world_size()
    torch.distributed.all_gather_object(rng_states, _rng_state(), group=mpu.get_data_parallel_group())
    dp = mpu.get_data_parallel_rank()
    if dp == 0 or args.use_distributed_optimizer:
        where.mkdir(parents=True, exist_ok=True)
    if dp == 0:
        state = {"iteration": iteration, "checkpoint_version": 3.0, "args": _args_snapshot(args),
                 "consumed_train_samples": args.consumed_train_samples,
                 "opt_param_scheduler": opt_param_scheduler.state_dict(), "rng_state": rng_states}
        for i, chunk in enumerate(model):
            state["model" if len(model) == 1 else f"model{i}"] = chunk.state_dict()
        if not args.use_distributed_optimizer:
            state["optimizer"] = optimizer.state_dict()
        _atomic_save(state, where / "model_optim_rng.pt")
    if args.use_distributed_optimizer:
        _atomic_save(optimizer.state_dict(), where / f"distrib_optim_dp{dp:03d}.pt")
    torch.distributed.barrier()  # every file is in place before the marker moves
    if torch.distributed.get_rank() == 0:
        meta = {k: getattr(args, k, None) for k in LAYOUT_KEYS}
        meta.update(iteration=iteration, data_parallel_size=args.data_parallel_size,
                    world_size=args.world_size)
        (iteration_dir(args.save, iteration) / "metadata.json").write_text(json.dumps(meta, indent=1))
        marker = Path(args.save) / TRACKER
        marker.with_name(TRACKER + ".tmp").write_text(str(iteration))
        os.replace(marker.with_name(TRACKER + ".tmp"), marker)
    torch.distributed.barrier()
    from minitron.training.utils import print_rank_0
    print_rank_0(f"> saved checkpoint at iteration {iteration} to {args.save}")


@traced
def load_checkpoint(model, optimizer, opt_param_scheduler) -> int:
    """Restore everything save_checkpoint wrote; return the iteration to continue from (0: none)."""
    args = get_args()
    iteration = read_latest_iteration(args.load)
    if iteration is None:
        from minitron.training.utils import print_rank_0
        print_rank_0(f"> no checkpoint in {args.load}: starting from scratch")
        return 0
    tp, pp = mpu.get_tensor_model_parallel_rank(), mpu.get_pipeline_model_parallel_rank()
    where = rank_dir(args.load, iteration, tp, pp, mpu.get_pipeline_model_parallel_world_size())
    path = where / "model_optim_rng.pt"
    if not path.exists():
        raise CheckpointError(f"{path} is missing: was the checkpoint saved with this tp/pp layout?")
    state = torch.load(path, map_location="cpu", weights_only=True)
    for i, chunk in enumerate(model):
        chunk.load_state_dict(state["model" if len(model) == 1 else f"model{i}"])
    if args.use_distributed_optimizer:
        shard = where / f"distrib_optim_dp{mpu.get_data_parallel_rank():03d}.pt"
        optimizer.load_state_dict(torch.load(shard, map_location="cpu", weights_only=True))
    else:
        optimizer.load_state_dict(state["optimizer"])
    opt_param_scheduler.load_state_dict(state["opt_param_scheduler"])
    _set_rng_state(state["rng_state"][mpu.get_data_parallel_rank()])
    args.consumed_train_samples = state["consumed_train_samples"]
    from minitron.training.utils import print_rank_0
    print_rank_0(f"> loaded checkpoint from {args.load} at iteration {iteration}")
    return iteration
