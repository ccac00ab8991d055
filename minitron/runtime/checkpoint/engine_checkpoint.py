"""The engine's ``save_checkpoint`` / ``load_checkpoint`` (``deepspeed/runtime/engine.py``'s
``_save_checkpoint``, ``_save_zero_checkpoint``, ``_load_checkpoint``), in DeepSpeed 0.19.8's
layout: same file names, same keys, tensors where DeepSpeed puts them (see ``__init__``).

Who writes what, as in DeepSpeed: at stages 0-2 the model is whole on every data-parallel rank,
so data-parallel rank 0 of each tensor rank writes the model-states file; at stage 3 each rank
holds only pieces, so every rank writes one (whose ``module`` has empty parameters and real
buffers; the weights are in the optimizer files). Every rank writes its optimizer partition at
stages 1-3; at stage 0 there is nothing to partition and the optimizer rides in the model file.

The model-states file also carries what a reader needs to rebuild whole fp32 weights from the
partitions without the model: ``param_shapes`` (per param group, in flat-buffer order: the only
record of how the flat partitions cut into parameters), ``buffer_names``, ``shared_params`` (tied
weights, stored once), and the frozen parameters, which no optimizer partition holds.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import torch

from minitron import comm as dist   # deepspeed/runtime/engine.py: from deepspeed import comm as dist
from minitron.runtime.checkpoint import constants as C
from minitron.runtime.checkpoint.pickles import load_state, save_state
from minitron.runtime.checkpoint.shard_owner import owner, owner_mismatch, read_owner, stamp_owner
from minitron.runtime.checkpoint.universal_checkpoint import load_universal_state
from minitron.runtime.utils import logger
from minitron.runtime.checkpoint.zero_checkpoint import (load_stage0_state_dict, load_zero_state_dict,
                                                         optimizer_groups, pipeline_loading, stage0_state_dict,
                                                         zero_state_dict)

# The model-states keys that are the engine's; load_checkpoint returns the rest as client state.
_ENGINE_KEYS = frozenset({
    "module", C.BUFFER_NAMES, "optimizer", C.PARAM_SHAPES, C.FROZEN_PARAM_SHAPES, C.SHARED_PARAMS,
    C.FROZEN_PARAM_FRAGMENTS, "lr_scheduler", "data_sampler", "random_ltd", "skipped_steps", "global_steps",
    "global_samples", "dp_world_size", "mp_world_size", C.CHECKPOINT_PARALLEL_DIMS, C.DS_CONFIG, C.DS_VERSION})


# --- names ------------------------------------------------------------------------------------------

def _mp_rank(engine) -> int:
    group = engine.optimizer.model_parallel_group
    return dist.get_rank(group=group) if group is not None else 0


def _dp_rank(engine) -> int:
    return dist.get_rank(group=engine.data_parallel_group)


def _owner(engine, per_data_parallel_rank: bool) -> dict:
    """Whose a file is (shard_owner.py): DeepSpeed's files record the sizes, not the ranks. The
    engine runs without a pipeline, so its model-parallel rank is the tensor rank."""
    group = engine.optimizer.model_parallel_group
    mp_size = dist.get_world_size(group=group) if group is not None else 1
    return owner(_mp_rank(engine), mp_size, dp=_dp_rank(engine) if per_data_parallel_rank else None,
                 dp_size=engine.dp_world_size)


def _check_owner(engine, file: Path, per_data_parallel_rank: bool) -> None:
    expected = _owner(engine, per_data_parallel_rank)
    problem = owner_mismatch(file, read_owner(file), expected, f"rank {engine.global_rank}")
    if problem:
        raise ValueError(problem)


def ckpt_name(engine, path: Path) -> Path:
    """``_get_ckpt_name``: the model-states file this rank writes or reads."""
    mp = f"{C.MODEL_FILE_PREFIX}{_mp_rank(engine):02d}{C.MODEL_FILE_SUFFIX}"
    if engine.zero_optimization_stage() == 3:
        return path / f"{C.ZERO_FILE_PREFIX}{_dp_rank(engine)}_{mp}"
    return path / mp


def zero_ckpt_name(engine, path: Path, dp_rank: int | None = None) -> Path:
    """``_get_zero_ckpt_name``: this rank's optimizer file (or data-parallel rank ``dp_rank``'s);
    bf16 runs get the ``bf16_`` prefix."""
    prefix = C.BF16_ZERO_FILE_PREFIX if engine._config.bfloat16_enabled else C.ZERO_FILE_PREFIX
    dp_rank = _dp_rank(engine) if dp_rank is None else dp_rank
    return path / f"{prefix}{dp_rank}_{C.MODEL_FILE_PREFIX}{_mp_rank(engine):02d}{C.OPTIM_FILE_SUFFIX}"


# --- what the model-states file holds ----------------------------------------------------------

def _buffer_names(module: torch.nn.Module) -> list:
    """Persistent buffers only: the others are not in the state dict."""
    names = []
    for prefix, m in module.named_modules():
        for name, buffer in m.named_buffers(recurse=False):
            if buffer is not None and name not in m._non_persistent_buffers_set:
                names.append(f"{prefix}.{name}" if prefix else name)
    return names


def _shape(p: torch.Tensor) -> torch.Size:
    return getattr(p, "ds_shape", p.shape)   # at stage 3 a released parameter's own shape is (0,)


def _shared_params(module: torch.nn.Module) -> dict:
    """Tied weights: each later name of a parameter -> the first name it appears under (the one
    the optimizer holds). DeepSpeed tells them apart by storage; the same Parameter object is
    what tying makes, and it survives stage 3, where storage is swapped at every gather."""
    first, shared = {}, {}
    for prefix, m in module.named_modules(remove_duplicate=False):
        for name, p in m.named_parameters(recurse=False):
            key = f"{prefix}.{name}" if prefix else name
            if id(p) in first and first[id(p)] != key:
                shared[key] = first[id(p)]
            first.setdefault(id(p), key)
    return shared


def _dtype(engine) -> torch.dtype:
    config = engine._config
    return torch.float16 if config.fp16_enabled else torch.bfloat16 if config.bfloat16_enabled else torch.float32


def _model_state(engine, names: dict) -> dict:
    """``_common_checkpoint_state``, key for key."""
    stage, opt = engine.zero_optimization_stage(), engine.optimizer
    optimized = {p for params in optimizer_groups(opt) for p in params}
    frozen = [(n, p) for n, p in engine.module.named_parameters() if p not in optimized]
    keep_frozen = stage >= 2   # DeepSpeed records frozen parameters from stage 2 on
    tp = dist.get_world_size(group=opt.model_parallel_group) if opt.model_parallel_group is not None else 1
    return {
        "module": engine.module.state_dict(),
        C.BUFFER_NAMES: _buffer_names(engine.module),
        "optimizer": stage0_state_dict(opt, _dtype(engine), engine.global_steps) if stage == 0 else None,
        C.PARAM_SHAPES: [{names[p]: _shape(p) for p in ps} for ps in optimizer_groups(opt)] if stage else None,
        C.FROZEN_PARAM_SHAPES: {n: _shape(p) for n, p in frozen} if keep_frozen else None,
        # Only global rank 0 looks for ties, as in DeepSpeed; a reader uses rank 0's file.
        C.SHARED_PARAMS: (_shared_params(engine.module) if engine.global_rank == 0 else {}) if stage else None,
        C.FROZEN_PARAM_FRAGMENTS: {n: p.detach().cpu() for n, p in frozen} if keep_frozen else None,
        "lr_scheduler": engine.lr_scheduler.state_dict() if engine.lr_scheduler is not None else None,
        "data_sampler": None, "random_ltd": None,   # curriculum learning and random-LTD: not built
        "skipped_steps": engine.skipped_steps, "global_steps": engine.global_steps,
        "global_samples": engine.global_samples, "dp_world_size": engine.dp_world_size, "mp_world_size": tp,
        # The engine refuses pipelines, so the pipeline degree is always 1.
        C.CHECKPOINT_PARALLEL_DIMS: {"pp_degree": 1, "tp_degree": tp},
        C.DS_CONFIG: engine._config._param_dict, C.DS_VERSION: C.DS_VERSION_WRITTEN,
    }


# --- save and load ------------------------------------------------------------------------------------

def save_checkpoint(engine, save_dir, tag=None, client_state: dict | None = None, save_latest: bool = True):
    """Every rank calls it (the barriers, and at stage 3 every rank's pieces)."""
    tag = str(tag) if tag is not None else f"global_step{engine.global_steps}"
    path, stage = Path(save_dir) / tag, engine.zero_optimization_stage()
    if engine.global_rank == 0:
        path.mkdir(parents=True, exist_ok=True)
    dist.barrier()
    _validate_tag(engine, tag)
    names = {p: n for n, p in engine.module.named_parameters()}
    if stage == 3 or _dp_rank(engine) == 0:
        torch.save({**_model_state(engine, names), **(client_state or {})}, ckpt_name(engine, path))
        stamp_owner(ckpt_name(engine, path), _owner(engine, per_data_parallel_rank=stage == 3))
    if stage >= 1:
        save_state({C.OPTIMIZER_STATE_DICT: zero_state_dict(engine.optimizer, names),
                    C.DS_CONFIG: engine._config._param_dict, C.DS_VERSION: C.DS_VERSION_WRITTEN},
                   zero_ckpt_name(engine, path))
        stamp_owner(zero_ckpt_name(engine, path), _owner(engine, per_data_parallel_rank=True))
        if engine.global_rank == 0:   # DeepSpeed copies its scripts beside the tags, not into one
            for script in C.RECOVERY_SCRIPTS:
                shutil.copyfile(Path(__file__).with_name(script), Path(save_dir) / script)
    dist.barrier()   # every rank's files are on disk before 'latest' names them
    if save_latest and engine.global_rank == 0:
        (Path(save_dir) / C.LATEST).write_text(tag)
    dist.barrier()
    return True


def _validate_tag(engine, tag: str) -> None:
    """checkpoint.tag_validation: every rank must save under one tag, or the save is torn across
    directories (a tag with the rank in it). The tag's SHA-1, all-reduced as max and as min,
    equals this rank's own only if every rank has the same one. "Warn" logs, "Fail" refuses."""
    mode = engine._config.features.tag_validation
    if mode == "IGNORE":
        return
    mine = torch.tensor(list(hashlib.sha1(tag.encode()).digest()), dtype=torch.uint8, device=engine.device)
    high, low = mine.clone(), mine.clone()
    dist.all_reduce(high, op=dist.ReduceOp.MAX)
    dist.all_reduce(low, op=dist.ReduceOp.MIN)
    if torch.equal(high, mine) and torch.equal(low, mine):
        return
    message = (f"[rank={engine.global_rank}] The checkpoint tag name '{tag}' is not consistent across all ranks; "
               "a tag with rank-specific parts tears the checkpoint across directories")
    if mode == "FAIL":
        raise ValueError(message + " (checkpoint.tag_validation \"Fail\")")
    logger.warning(message)


def _read(file: Path, what: str) -> dict:
    if not file.is_file():
        there = sorted(f.name for f in file.parent.glob("*.pt")) if file.parent.is_dir() else []
        raise ValueError(f"no {file.name} in {file.parent} ({what}; found: {', '.join(there) or 'nothing'}): "
                         "load with the ZeRO stage, precision and tensor-parallel size it was saved with")
    return load_state(file)


@torch.no_grad()
def load_checkpoint(engine, load_dir, tag=None, load_module_strict: bool = True):
    """Returns ``(load_path, client_state)``, or ``(None, None)`` when there is no ``latest``.
    With ``"checkpoint": {"load_universal": true}`` the tag is ``latest_universal``'s and the
    checkpoint a universal one (ds_to_universal.py), which any dp size and stage can load."""
    universal = engine._config.load_universal_checkpoint
    if tag is None:
        latest = Path(load_dir) / (C.LATEST_UNIVERSAL if universal else C.LATEST)
        if not latest.is_file():
            if universal:   # DeepSpeed refuses too: there is no "start from scratch" here
                raise ValueError(f"no {latest}: convert a checkpoint first (python -m minitron.runtime.checkpoint."
                                 "ds_to_universal writes it), or drop checkpoint.load_universal from the ds_config")
            return None, None
        tag = latest.read_text().strip()
    if universal:
        return _load_universal(engine, Path(load_dir) / str(tag))
    path, stage, opt = Path(load_dir) / str(tag), engine.zero_optimization_stage(), engine.optimizer
    zero = engine._config.zero_config
    elastic = zero.elastic_checkpoint and stage in (1, 2)   # every rank reads every rank's optimizer file
    if not elastic:   # an elastic load may change the dp size, which the model file's owner records
        _check_owner(engine, ckpt_name(engine, path), per_data_parallel_rank=stage == 3)   # before unpickling it
    state = _read(ckpt_name(engine, path), "the model states")
    if C.DS_VERSION not in state:
        raise ValueError(f"{path} is in minitron's layout from before it wrote DeepSpeed's (no ds_version in its "
                         "model-states file): save it again with this minitron, or load it with the one that wrote it")
    if state["dp_world_size"] != engine.dp_world_size and not elastic:
        raise ValueError(f"{path} was saved by {state['dp_world_size']} data-parallel ranks, this run has "
                         f"{engine.dp_world_size}: ZeRO partitions do not carry over; resume with the same size "
                         "(or save and load at ZeRO stage 1-2 with zero_optimization.elastic_checkpoint)")
    if stage == 3:   # the parameters' entries are empty; their pieces come with the optimizer
        engine.module.load_state_dict({n: state["module"][n] for n in state[C.BUFFER_NAMES]}, strict=False)
    else:
        engine.module.load_state_dict(state["module"], strict=load_module_strict)
    if stage == 0:
        if state["optimizer"] is None:   # saved at 1-3: the optimizer is in partitions, not here
            raise ValueError(f"{path} was saved at a ZeRO stage above 0 and this run has stage 0: "
                             "resume with the stage it was saved at")
        load_stage0_state_dict(opt, state["optimizer"], _dtype(engine))
    elif elastic:
        every = [_read(_owned(engine, path, r, state["dp_world_size"]), f"data-parallel rank {r}'s optimizer "
                       "partition")[C.OPTIMIZER_STATE_DICT] for r in range(state["dp_world_size"])]
        mine = every[_dp_rank(engine)] if _dp_rank(engine) < len(every) else every[0]
        with pipeline_loading(stage, zero.stage3.pipeline_loading_checkpoint):   # refuses it below stage 3
            load_zero_state_dict(opt, mine, zero.load_from_fp32_weights, every_rank=every)
    else:
        _check_owner(engine, zero_ckpt_name(engine, path), per_data_parallel_rank=True)
        with pipeline_loading(stage, zero.stage3.pipeline_loading_checkpoint):   # the node's ranks in turn
            load_zero_state_dict(opt, _read(zero_ckpt_name(engine, path), "this rank's optimizer partition")
                                 [C.OPTIMIZER_STATE_DICT], zero.load_from_fp32_weights)
    return _restore_counters(engine, path, state)


def _owned(engine, path: Path, dp_rank: int, dp_size: int) -> Path:
    """Saved data-parallel rank ``dp_rank``'s optimizer file, its owner record checked against the
    saving run's layout (an elastic load reads them all, at any dp size)."""
    file = zero_ckpt_name(engine, path, dp_rank)
    group = engine.optimizer.model_parallel_group
    expected = owner(_mp_rank(engine), dist.get_world_size(group=group) if group is not None else 1,
                     dp=dp_rank, dp_size=dp_size)
    problem = owner_mismatch(file, read_owner(file), expected, f"rank {engine.global_rank}")
    if problem:
        raise ValueError(problem)
    return file


def _restore_counters(engine, path: Path, state: dict) -> tuple:
    """The schedule and the counters, from the model-states file; the rest is the client's."""
    if engine.lr_scheduler is not None and state["lr_scheduler"] is not None:
        engine.lr_scheduler.load_state_dict(state["lr_scheduler"])
    # DeepSpeed restores these three; micro_steps restarts, which is the same at a step's boundary.
    engine.global_steps, engine.skipped_steps = state["global_steps"], state["skipped_steps"]
    engine.global_samples = state.get("global_samples", engine.global_steps * engine.train_batch_size())
    return str(path), {k: v for k, v in state.items() if k not in _ENGINE_KEYS}


def _load_universal(engine, path: Path) -> tuple:
    """Weights and moments from ``path/zero/`` (universal_checkpoint.py), buffers, schedule and
    counters from the copied model-states file: the saving run's stage decides its name, and a
    universal checkpoint is loaded at any stage, so either name is read."""
    if engine.optimizer.model_parallel_group is not None:
        raise ValueError("a universal checkpoint loads at tensor-parallel size 1 here (ds_to_universal converts "
                         "no tensor slices): resume with --tensor-model-parallel-size 1")
    if not (path / C.UNIVERSAL_ZERO_FOLDER).is_dir():
        raise ValueError(f"{path} has no {C.UNIVERSAL_ZERO_FOLDER}/ folder, so it is no universal checkpoint: "
                         "convert it with python -m minitron.runtime.checkpoint.ds_to_universal")
    mp = path / f"{C.MODEL_FILE_PREFIX}00{C.MODEL_FILE_SUFFIX}"
    if not mp.is_file():   # converted from stage 3: every rank's file was copied; rank 0's will do
        mp = path / f"{C.ZERO_FILE_PREFIX}0_{mp.name}"
    state = _read(mp, "the model states ds_to_universal copied")
    engine.module.load_state_dict({n: state["module"][n] for n in state[C.BUFFER_NAMES] if n in state["module"]},
                                  strict=False)
    names = {p: n for n, p in engine.module.named_parameters()}   # a tied weight under its first name
    load_universal_state(engine.optimizer, path / C.UNIVERSAL_ZERO_FOLDER, names)
    return _restore_counters(engine, path, state)
