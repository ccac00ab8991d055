"""The optimizer's share of a checkpoint, in the form DeepSpeed 0.19.8 gives it at each stage.

Stages 1-2 (``DeepSpeedZeroOptimizer.state_dict``): my partition of each group's fp32 master,
*without* the padding that made the partitions equal (``group_paddings`` says how much was cut),
and the Adam's own state dict, whose moments are my partition's, padding included.
A reader glues the ranks' lean partitions end to end and walks ``param_shapes`` through them.

Stage 3 (``DeepSpeedZeroOptimizer_Stage3._rigid_state_dict``): my pieces of every parameter,
end to end, padding kept (``fp32_flat_groups``); a reader takes piece r of each parameter from
rank r, ceil(numel / dp) elements at a time.

Stage 0: DeepSpeed has no ZeRO optimizer and no optimizer files; the state goes into the
model-states file under ``optimizer``. In fp32 the optimizer owns the module's tensors, so it is
the optimizer's own state dict, one entry per parameter: minitron keeps one flat master per
group at every stage, so it is cut into parameters on the way out and glued back on the way in.
At 16 bits it is the state dict of the wrapper DeepSpeed puts around the Adam: FP16_Optimizer
around FusedAdam, FP16_UnfusedOptimizer around torch's (stage0_state_dict, below).

The optimizer's own state dict is in the form of the Adam the config runs, DeepSpeed's FusedAdam
or torch's (adam_state.py shows both); a loader puts whichever it reads into its own form.

The loss scaler is pickled as DeepSpeed's own object (``deepspeed_scaler``), since DeepSpeed's
engine adopts the unpickled object as its scaler. minitron reads back its attributes, or the dict
of them minitron wrote before it wrote DeepSpeed's object.
"""

from __future__ import annotations

import contextlib
import os
from types import SimpleNamespace

import torch

from minitron import comm as dist
from minitron.accelerator import get_accelerator

from minitron.ops.adam import FusedAdam
from minitron.runtime.checkpoint import constants as C
from minitron.runtime.checkpoint.adam_state import running_form
from minitron.runtime.checkpoint.elastic_checkpoint import (is_elastic, lean_base_optimizer_state, restore_elastic,
                                                            restore_own_lean)
from minitron.runtime.checkpoint.pickles import DeepSpeedObject, deepspeed_object
from minitron.runtime.zero.stage3 import DeepSpeedZeroOptimizer_Stage3

# The keys a dynamic scaler adds at stage 0 (FP16_Optimizer.state_dict), beside cur_scale.
_DYNAMIC_STAGE0_KEYS = ("last_overflow_iter", "scale_factor", "scale_window")


def optimizer_groups(opt) -> list:
    """Each param group's parameters, in flat-buffer order (stage 3 calls them fp16_groups)."""
    return opt.fp16_groups if isinstance(opt, DeepSpeedZeroOptimizer_Stage3) else opt.bit16_groups


# A DeepSpeed 0.19.8 DynamicLossScaler's attributes beyond cur_scale and dynamic, in the order its
# __init__ sets them; minitron's scaler has all but dtype (DeepSpeed scales dynamically only fp16).
_DYNAMIC_ATTRIBUTES = ("cur_iter", "last_overflow_iter", "scale_factor", "scale_window", "min_scale",
                       "delayed_shift", "cur_hysteresis", "consecutive_hysteresis", "raise_error_at_min_scale")
_SCALER_MODULE = "deepspeed.runtime.fp16.loss_scaler."


def deepspeed_scaler(scaler) -> DeepSpeedObject:
    """``scaler`` as DeepSpeed's LossScaler or DynamicLossScaler: the class name and exactly the
    attributes a real one holds (``vars()``), so DeepSpeed's engine can run on with it."""
    state = {"cur_scale": scaler.cur_scale, "dynamic": scaler.dynamic}
    if not scaler.dynamic:
        return deepspeed_object(_SCALER_MODULE + "LossScaler", state)
    state.update({k: getattr(scaler, k) for k in _DYNAMIC_ATTRIBUTES}, dtype=torch.float16)
    return deepspeed_object(_SCALER_MODULE + "DynamicLossScaler", state)


def scaler_state(scaler, saved) -> dict:
    """A saved scaler as a dict of the attributes ``scaler`` keeps, whether it was saved as
    minitron's dict or pickled as DeepSpeed's object (read back by pickles.py)."""
    saved = saved if isinstance(saved, dict) else vars(saved)
    return {k: saved[k] for k in scaler.state_dict() if k in saved}


def _partition_bounds(opt, i: int) -> tuple[int, int, int]:
    """(start, size, padding) of my partition of group i's flat buffer (stages 1-2)."""
    size = opt.bit16_groups_flat[i].numel() // opt.partition_count
    start = opt.partition_id * size
    real = sum(p.numel() for p in opt.bit16_groups[i])
    return start, size, min(max(start + size - real, 0), size)


def _slice_mappings(opt, i: int, names: dict) -> dict:
    """Which elements of which parameter my partition holds: name -> (numel, start), start
    counted from the partition's first element. DeepSpeed pickles its own fragment_address
    dataclass, and its ds_to_universal reads ``.start`` and ``.numel``; a SimpleNamespace has
    the same attributes and needs no class of ours (or theirs) to unpickle."""
    start, size, _ = _partition_bounds(opt, i)
    found, offset = {}, 0
    for p in opt.bit16_groups[i]:
        lo, hi = max(offset, start), min(offset + p.numel(), start + size)
        if lo < hi:
            found[names[p]] = SimpleNamespace(numel=hi - lo, start=lo - start)
        offset += p.numel()
    return found


def zero_state_dict(opt, names: dict) -> dict:
    """What goes under ``optimizer_state_dict`` in my ``*_optim_states.pt`` at stages 1-3."""
    common = {C.LOSS_SCALER: deepspeed_scaler(opt.loss_scaler), "dynamic_loss_scale": opt.loss_scaler.dynamic,
              "overflow": opt.overflow}
    masters = opt.single_partition_of_fp32_groups
    if opt.stage == 3:
        return {C.ZERO_STAGE: 3, **common, C.PARTITION_COUNT: opt.partition_count,
                C.OPTIMIZER_STATE_DICT: opt.optimizer.state_dict(),
                C.FP32_FLAT_GROUPS: [m.detach().clone() for m in masters]}
    bounds = [_partition_bounds(opt, i) for i in range(len(masters))]
    # elastic_checkpoint: lean moments per group and the step apart (elastic_checkpoint.py)
    base = (lean_base_optimizer_state(opt, [pad for _, _, pad in bounds]) if opt.elastic_checkpoint else
            {C.BASE_OPTIMIZER_STATE: opt.optimizer.state_dict()})
    return {**common, C.CLIP_GRAD: opt.clip_grad, **base,
            C.SINGLE_PARTITION_OF_FP32_GROUPS: [m.detach()[:size - pad].clone()
                                                for m, (_, size, pad) in zip(masters, bounds)],
            C.ZERO_STAGE: opt.stage, C.GROUP_PADDINGS: [pad for _, _, pad in bounds],
            # Padding between parameters: none here, every parameter follows the last directly.
            C.PARAM_ALIGNMENT_PADDINGS: [[0] * len(ps) for ps in opt.bit16_groups],
            C.PARTITION_COUNT: [opt.partition_count] * len(masters), C.DS_VERSION: C.DS_VERSION_WRITTEN,
            C.PARAM_SLICE_MAPPINGS: [_slice_mappings(opt, i, names) for i in range(len(masters))]}


@torch.no_grad()
def load_zero_state_dict(opt, state: dict, load_from_fp32_weights: bool = True, every_rank: list | None = None) -> None:
    """The inverse of zero_state_dict, for a file minitron or DeepSpeed wrote. The fp32 masters
    are the truth: the 16-bit (or fp32) model weights are copied from them. With
    ``zero_optimization.load_from_fp32_weights`` false, stages 1-2 take the masters from the
    model's weights instead, loaded already from the model-states file (DeepSpeed's
    _restore_from_bit16_weights): a 16-bit model's masters come back rounded to 16 bits, and
    the checkpoint's fp32 partitions are not read. DeepSpeed's stage-3 loader restores the fp32
    pieces whatever the key says, and so does this one. ``every_rank``: every saved rank's state,
    read with elastic_checkpoint; an elastic file is then re-cut for this run's dp size."""
    saved_count = state[C.PARTITION_COUNT]
    saved_count = max(saved_count) if isinstance(saved_count, list) else saved_count
    elastic = every_rank is not None and opt.stage in (1, 2) and is_elastic(state)
    if int(state[C.ZERO_STAGE]) != opt.stage or saved_count != opt.partition_count and not elastic:
        raise ValueError(f"this checkpoint was saved at ZeRO stage {int(state[C.ZERO_STAGE])} with {saved_count} "
                         f"partitions; this run has stage {opt.stage} with {opt.partition_count}: resume with "
                         "the same stage and data-parallel size")
    three = opt.stage == 3
    opt.loss_scaler.load_state_dict(scaler_state(opt.loss_scaler, state[C.LOSS_SCALER]))
    if elastic:
        restore_elastic(opt, every_rank, load_from_fp32_weights)
        for i in range(len(opt.single_partition_of_fp32_groups)):
            if not load_from_fp32_weights:
                opt.single_partition_of_fp32_groups[i].copy_(opt.parallel_partitioned_bit16_groups[i][opt.partition_id])
            opt._publish(i)
        return
    if not three and is_elastic(state):   # an elastic file at the same dp size, read rigidly
        restore_own_lean(opt, state)
    else:
        opt.optimizer.load_state_dict(running_form(opt.optimizer,
                                                  state[C.OPTIMIZER_STATE_DICT if three else C.BASE_OPTIMIZER_STATE]))
    saved = state[C.FP32_FLAT_GROUPS if three else C.SINGLE_PARTITION_OF_FP32_GROUPS]
    for i, (master, part) in enumerate(zip(opt.single_partition_of_fp32_groups, saved)):
        master.zero_()                      # the padding a lean partition left out
        if load_from_fp32_weights or three:
            master[:part.numel()].copy_(part)
        else:
            master.copy_(opt.parallel_partitioned_bit16_groups[i][opt.partition_id])
        opt._publish(i)


@contextlib.contextmanager
def pipeline_loading(stage: int, on: bool):
    """``zero_optimization.pipeline_loading_checkpoint``: a node's ranks read their optimizer
    files one after the other, each waiting for the previous local rank's word (a one-element
    send/recv), so that a node's host memory holds one rank's file at a time rather than all of
    them at once (DeepSpeed's _load_zero_checkpoint). Stage 3 only, asserted at the load, as
    DeepSpeed asserts it."""
    if not on:
        yield
        return
    if stage != 3:
        raise ValueError("zero_optimization.pipeline_loading_checkpoint: only ZeRO stage 3 loads checkpoints "
                         f"in a pipeline (DeepSpeed's assertion), this run has stage {stage}; remove the key")
    rank, world = dist.get_rank(), dist.get_world_size()
    local = int(os.environ.get("LOCAL_RANK", rank))   # DeepSpeed's dist.get_local_rank() reads it too
    serial = torch.zeros(1, device=get_accelerator().current_device_name())
    if local != 0:
        dist.recv(serial, src=rank - 1)
    yield
    serial += 1
    if local != world - 1:   # DeepSpeed compares the local rank with the world's last rank, as here
        dist.send(serial, dst=rank + 1)


# --- stage 0: one state per parameter ----------------------------------------------------------

def _pieces(flat: torch.Tensor, params: list) -> list:
    """Views of ``flat`` cut into ``params``' shapes, end to end (the padding left over)."""
    offsets = [0]
    for p in params:
        offsets.append(offsets[-1] + p.numel())
    return [flat.detach()[a:b].view(p.shape) for a, b, p in zip(offsets, offsets[1:], params)]


def _per_parameter(opt) -> dict:
    """The Adam's state dict as if it had been given the parameters themselves. Each parameter
    gets its own copy of the step count: torch's Adam adds 1 to a tensor count in place, so one
    tensor shared by a group would count once per parameter."""
    flat = opt.optimizer.state_dict()
    state, groups, index = {}, [], 0
    for params, group in zip(opt.bit16_groups, flat["param_groups"]):
        moments, ids = flat["state"].get(group["params"][0], {}), []
        cut = {k: _pieces(v, params) for k, v in moments.items() if torch.is_tensor(v) and v.dim() > 0}
        for j in range(len(params)):
            if moments:
                state[index + j] = {k: cut[k][j].clone() if k in cut else v.clone() if torch.is_tensor(v) else v
                                    for k, v in moments.items()}
            ids.append(index + j)
        index += len(params)
        groups.append({**group, "params": ids})
    return {"state": state, "param_groups": groups}


def _glue(tensors: list, like: torch.Tensor) -> torch.Tensor:
    """Tensors flattened end to end into a zero tensor shaped like one flat group (its tail
    is the padding)."""
    flat = torch.zeros_like(like)
    if tensors:
        joined = torch.cat([t.detach().reshape(-1) for t in tensors])
        flat[:joined.numel()].copy_(joined)
    return flat


def _load_per_parameter(opt, saved: dict) -> None:
    """Glue per-parameter moments back into each group's flat one."""
    saved, state, groups = running_form(opt.optimizer, saved), {}, []
    for i, (master, group) in enumerate(zip(opt.single_partition_of_fp32_groups, saved["param_groups"])):
        ids = group["params"]
        if ids and ids[0] in saved["state"]:
            state[i] = {k: _glue([saved["state"][j][k] for j in ids], master)
                        if torch.is_tensor(v) and v.dim() > 0 else v for k, v in saved["state"][ids[0]].items()}
        groups.append({**group, "params": [i]})
    opt.optimizer.load_state_dict({"state": state, "param_groups": groups})


def _resized(flat_state: dict, numels: list) -> dict:
    """A torch state dict over one flat tensor per group (so state k is group k's), each moment
    cut or zero-padded to ``numels[k]`` elements: DeepSpeed's FP16_Optimizer flattens without
    padding, minitron pads to 2 x dp."""
    def fit(v, n):
        return _glue([v[:n]], v.new_zeros(n)) if torch.is_tensor(v) and v.dim() > 0 else v
    return {"state": {k: {name: fit(v, numels[k]) for name, v in moments.items()}
                      for k, moments in flat_state["state"].items()},
            "param_groups": flat_state["param_groups"]}


def stage0_state_dict(opt, dtype: torch.dtype, steps: int) -> dict:
    """What goes under ``optimizer`` in the model-states file at stage 0: in fp32 the Adam's own
    state dict; at 16 bits DeepSpeed's wrapper's, which depends on the Adam. Around its FusedAdam
    it is FP16_Optimizer: one flat fp32 master per group, unpadded, and the loss scale only where
    there is one (fp16). Around torch's Adam (``torch_adam``) it is FP16_UnfusedOptimizer: a
    master per parameter, and the loss scale always (in bf16: fixed at 1)."""
    if dtype == torch.float32:
        return _per_parameter(opt)
    fused, scaler = isinstance(opt.optimizer, FusedAdam), opt.loss_scaler
    out = {}
    if dtype == torch.float16 or not fused:
        # A fixed scaler counts no iterations of its own; DeepSpeed's counts every step.
        out = {"dynamic_loss_scale": scaler.dynamic, "cur_scale": scaler.cur_scale,
               "cur_iter": getattr(scaler, "cur_iter", steps)}
        if scaler.dynamic:
            out.update({k: getattr(scaler, k) for k in _DYNAMIC_STAGE0_KEYS})
    if not fused:
        return {**out, C.OPTIMIZER_STATE_DICT: _per_parameter(opt),
                C.FP32_GROUPS: [[piece.clone() for piece in _pieces(master, params)]
                                for master, params in zip(opt.single_partition_of_fp32_groups, opt.bit16_groups)]}
    lean = [sum(p.numel() for p in params) for params in opt.bit16_groups]
    return {**out, C.OPTIMIZER_STATE_DICT: _resized(opt.optimizer.state_dict(), lean),
            C.FP32_GROUPS_FLAT: [m.detach()[:n].clone() for m, n in zip(opt.single_partition_of_fp32_groups, lean)],
            C.CLIP_GRAD: opt.clip_grad}


@torch.no_grad()
def load_stage0_state_dict(opt, state: dict, dtype: torch.dtype) -> None:
    """The inverse of stage0_state_dict. In fp32 the masters are the module's weights, which the
    caller has loaded already; at 16 bits they are ``fp32_groups_flat``, or, from DeepSpeed
    given a torch optimizer (FP16_UnfusedOptimizer), ``fp32_groups``: a master per parameter."""
    masters = opt.single_partition_of_fp32_groups
    if dtype == torch.float32:
        _load_per_parameter(opt, state)
        saved = opt.bit16_groups
    elif C.FP32_GROUPS in state:
        _load_per_parameter(opt, state[C.OPTIMIZER_STATE_DICT])
        saved = state[C.FP32_GROUPS]
    else:
        opt.optimizer.load_state_dict(_resized(running_form(opt.optimizer, state[C.OPTIMIZER_STATE_DICT]),
                                               [m.numel() for m in masters]))
        saved = [[flat] for flat in state[C.FP32_GROUPS_FLAT]]
    if dtype != torch.float32:
        scaler = opt.loss_scaler
        for key in ("cur_scale", "cur_iter", *_DYNAMIC_STAGE0_KEYS) if scaler.dynamic else ("cur_scale",):
            if key in state:
                setattr(scaler, key, state[key])
    for i, master in enumerate(masters):
        master.copy_(_glue(saved[i], master))
        opt._publish(i)
