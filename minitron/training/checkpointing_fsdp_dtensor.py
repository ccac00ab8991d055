"""--ckpt-format fsdp_dtensor: Megatron-FSDP's checkpoint, which resumes at another dp size.

Megatron-FSDP keeps each parameter as a DTensor over the data-parallel mesh: the global
tensor is the parameter, each rank holds its part of it. Its checkpoint is that state dict
handed to torch's DCP, keyed by the parameter's name, so every rank writes what it holds and
a later run reads the parts *its* layout holds: any dp size, any sharding strategy.

Here a rank's part is its shard of a unit's flat buffer (unit.py), which may cut a parameter
anywhere, mid-row included. A flat range of a row-major tensor is a few rectangles (a tail of
one row, whole rows, the head of another): each rectangle is one chunk of the global tensor,
at its place in the parameter's full shape, so the stored tensors are the model's own::

    SAVE/iter_0000040/
        .metadata, __<rank>_0.distcp     DCP: for each parameter NAME (Megatron's keys)
                                           model.module.NAME                     the weights
                                           optimizer.state.module.NAME.exp_avg   Adam's moments
                                           optimizer.state.module.NAME.fp32_param  16-bit runs
                                         and each rank's RNG states (a (pp, tp, dp) grid)
        common.pt, metadata.json         as torch_dist (checkpointing_dist.py), backend fsdp_dtensor

Writing, rank r puts in the rows of [r*S, (r+1)*S) of every unit, whatever the strategy, so
each element is written once. Reading, a rank asks for what it holds: its shard
(optim_grads_params) or the whole unit (the others), and its optimizer pieces.
Layers are keyed by their global number (layer_number - 1), so a pipeline stage's layer 0
is the checkpoint's layer 2 when it is; tensor-parallel slices sit at their offset along the
partition dimension. The pipeline and tensor sizes must be the saved ones (checkpoint_resume).
"""

from __future__ import annotations

import re

import torch

from minitron.core import dist_checkpointing
from minitron.core import parallel_state as mpu
from minitron.core.dist_checkpointing import ShardedTensor
from minitron.core.dist_checkpointing.serialization import load_common_state_dict, read_dcp_metadata
from minitron.core.transformer.transformer_layer import TransformerLayer
from minitron.training.checkpoint_files import CheckpointError
from minitron.training.checkpointing_dist import _rng_object, restore_common, save_checkpoint_dist_common

BACKEND_NAME = "fsdp_dtensor"


def rectangles(shape, lo: int, hi: int, base: int = 0) -> list:
    """The flat range [lo, hi) of a row-major tensor of ``shape`` as rectangular blocks:
    [(flat start, offset, size)], in order. ``base`` is where the tensor starts in the range's
    numbering (the recursion enters one row at a time)."""
    if lo >= hi:
        return []
    if len(shape) <= 1:
        return [(lo, (lo - base,), (hi - lo,))]
    row = 1
    for n in shape[1:]:
        row *= n
    first, last = (lo - base) // row, (hi - 1 - base) // row
    if first == last:   # inside one row: that row's blocks, one axis down
        return [(start, (first, *offset), (1, *size))
                for start, offset, size in rectangles(shape[1:], lo, hi, base + first * row)]
    out = []
    if (lo - base) % row:   # the tail of a row
        end = base + (first + 1) * row
        out += rectangles(shape, lo, end, base)
        lo = end
    whole_end = hi - (hi - base) % row
    if whole_end > lo:      # whole rows: one block
        out.append((lo, ((lo - base) // row, *[0] * (len(shape) - 1)), ((whole_end - lo) // row, *shape[1:])))
    if hi > whole_end:      # the head of the last row
        out += rectangles(shape, whole_end, hi, base)
    return out


def _global_layer_names(module) -> dict:
    """'decoder.layers.<local i>.' -> 'decoder.layers.<global i>.' of this chunk's layers."""
    out = {}
    for name, m in module.named_modules():
        if isinstance(m, TransformerLayer):
            out[name + "."] = re.sub(r"\.(\d+)$", f".{m.layer_number - 1}", name) + "."
    return out


_LOCAL_EXPERT = re.compile(r"(\.experts\.local_experts\.)(\d+)(\.)|(\.experts\.linear_fc[12]\.(?:weight|bias))(\d+)()$")


def param_names(fsdp) -> dict:
    """Each parameter of an FSDP chunk -> its name in the checkpoint: Megatron's key (the
    model's name, wrappers stripped) with the layer's global number and, as Megatron's
    handle_experts_in_state_dict, the expert's global number (ep rank x local experts + i)."""
    layers = _global_layer_names(fsdp.module)
    experts = getattr(fsdp.config, "num_moe_experts", None)
    first_expert = mpu.get_expert_model_parallel_rank() * (experts or 0) // mpu.get_expert_model_parallel_world_size()
    out = {}
    for name, p in fsdp.module.named_parameters():
        for local, found in layers.items():
            if name.startswith(local):
                name = found + name[len(local):]
                break
        while name.startswith("module."):   # Float16Module's wrapping is no part of the model's names
            name = name[len("module."):]
        out[p] = _LOCAL_EXPERT.sub(lambda m: f"{m.group(1) or m.group(4)}"
                                   f"{first_expert + int(m.group(2) or m.group(5))}{m.group(3) or ''}", name)
    return out


_SWIGLU_FC1 = re.compile(r"\.mlp\.(experts\.(local_experts\.\d+\.)?)?linear_fc1\.(weight|bias)\d*$")


def _parts(name: str, param, gated: bool) -> list:
    """[(key suffix, first element, shape)] of a parameter in the checkpoint: itself, or
    SwiGLU's fc1 as Megatron stores it, the gate rows (``_w``) and the up rows (``_v``) under two
    keys. Each tensor-parallel rank holds [its gate rows; its up rows], so only split can each
    half be one tensor whose slices sit at the rank's offset."""
    if gated and _SWIGLU_FC1.search(name):
        half = (param.shape[0] // 2, *param.shape[1:])
        return [("_w", 0, half), ("_v", param.numel() // 2, half)]
    return [("", 0, tuple(param.shape))]


def _placement(param, shape):
    """(global shape, offset of this rank's slice) of a part of ``shape``: tensor-parallel
    parameters are one slice of the whole, cut along partition_dim."""
    expert = not getattr(param, "allreduce", True)   # an expert is cut over expert tensor parallelism
    group = mpu.get_expert_tensor_parallel_group() if expert else mpu.get_tensor_model_parallel_group()
    tp = torch.distributed.get_world_size(group=group)
    if tp == 1 or not getattr(param, "tensor_model_parallel", False):
        return shape, (0,) * len(shape)
    dim = param.partition_dim
    glob = list(shape)
    glob[dim] *= tp
    offset = [0] * len(shape)
    offset[dim] = torch.distributed.get_rank(group=group) * shape[dim]
    return tuple(glob), tuple(offset)


def _chunks(key: str, param, parts: list, values: torch.Tensor, lo: int, hi: int, values_start: int) -> list:
    """ShardedTensors for elements [lo, hi) of param.view(-1), whose values sit in ``values``
    (1-D) from param element ``values_start`` on; one key per part (_parts), its suffix where
    ``key`` says {}."""
    out = []
    for suffix, first, shape in parts:
        numel = 1
        for n in shape:
            numel *= n
        glob, at = _placement(param, shape)
        for start, offset, size in rectangles(shape, max(lo, first) - first, min(hi, first + numel) - first):
            n = 1
            for s in size:
                n *= s
            start += first - values_start
            data = values[start:start + n].view(size)
            out.append(ShardedTensor(key.format(suffix), data, data.dtype, tuple(size), glob,
                                     tuple(o + a for o, a in zip(offset, at)), None))
    return out


def _held(unit, writing: bool):
    """(values, first element of the unit they hold, end): what this rank writes (its rank's
    range of the unit) or reads into (what it keeps of the unit)."""
    r0 = torch.distributed.get_rank(group=unit.group) * unit.shard_size
    if unit.sharded_params:
        return unit.shard, r0, r0 + unit.shard_size
    if writing:
        return unit.flat[r0:r0 + unit.shard_size], r0, r0 + unit.shard_size
    return unit.flat, 0, unit.flat.numel()


def _model_entries(model, writing: bool) -> dict:
    entries = {}
    for i, fsdp in enumerate(model):
        names, gated = param_names(fsdp), fsdp.config.gated_linear_unit
        for unit in fsdp.units:
            values, u0, u1 = _held(unit, writing)
            for p in unit.params:
                start = unit.offsets[p]
                lo, hi = max(start, u0), min(start + p.numel(), u1)
                if lo < hi:
                    key = f"model.module.{names[p]}{{}}"
                    entries[f"{i}.{key}"] = _chunks(key, p, _parts(names[p], p, gated), values, lo - start,
                                                    hi - start, u0 - start)
    return entries


def _optimizer_entries(model, optimizer, names_of_state: list, writing: bool) -> tuple[dict, list]:
    """The optimizer's pieces as chunks of the parameters' shapes; when reading, also the
    (tensor loaded into, where it goes) pairs to copy afterwards."""
    entries, fills = {}, []
    for i, fsdp in enumerate(model):
        names, gated = param_names(fsdp), fsdp.config.gated_linear_unit
        for unit in fsdp.units:
            r0 = torch.distributed.get_rank(group=unit.group) * unit.shard_size
            for p in unit.params:
                owned = optimizer.owned.get(p)
                if owned is None:
                    continue
                main, p0 = owned
                lo, hi = p0, p0 + main.numel()
                if writing:   # only the rank's range of the unit: each element once
                    start = unit.offsets[p]
                    lo, hi = max(lo, r0 - start), min(hi, r0 + unit.shard_size - start)
                state = optimizer.optimizer.state.get(main, {})
                # a main copy of its own (a 16-bit model's fp32 main params) is saved beside the moments
                for name in (["fp32_param"] if main.dtype != p.dtype else []) + names_of_state:
                    key = f"optimizer.state.module.{names[p]}{{}}.{name}"
                    if writing:
                        value = main.detach() if name == "fp32_param" else state[name]
                    else:
                        value = torch.zeros(main.numel(), dtype=main.dtype, device=main.device)
                        fills.append((value, main, name))
                    entries[f"{i}.{key}"] = _chunks(key, p, _parts(names[p], p, gated), value.reshape(-1), lo, hi,
                                                    p0)
    return entries, fills


def save_checkpoint_fsdp_dtensor(iteration: int, model, optimizer, opt_param_scheduler, args, rng_state) -> None:
    names = sorted(k for s in optimizer.optimizer.state.values() for k, v in s.items()
                   if k != "step" and isinstance(v, torch.Tensor))
    names = sorted(set(names))
    sharded = {"model": _model_entries(model, writing=True), "rng_state": _rng_object(rng_state),
               "optimizer": _optimizer_entries(model, optimizer, names, writing=True)[0]}
    save_checkpoint_dist_common(iteration, sharded, names, optimizer, opt_param_scheduler, args,
                                backend=BACKEND_NAME)


def load_checkpoint_fsdp_dtensor(where, model, optimizer, opt_param_scheduler, args):
    """Load into this layout; return (the saving run's args, this rank's saved RNG state or None)."""
    common = load_common_state_dict(where)
    sharded = {"model": _model_entries(model, writing=False)}
    load_rng = not args.no_load_rng and \
        _rng_object(None).unique_key in read_dcp_metadata(where).state_dict_metadata
    if load_rng:
        sharded["rng_state"] = _rng_object(None)
    fills = []
    if not args.no_load_optim:
        sharded["optimizer"], fills = _optimizer_entries(model, optimizer, common["optimizer"]["state_names"],
                                                         writing=False)
    try:
        loaded = dist_checkpointing.load(sharded, where)
    except dist_checkpointing.CheckpointingException as exc:
        raise CheckpointError(str(exc)) from None
    if args.no_load_optim:
        optimizer.reload_model_params()
    else:
        step = common["optimizer"]["step"]
        for value, main, name in fills:
            if name == "fp32_param":
                main.data.copy_(value.view_as(main))
                continue
            state = optimizer.optimizer.state.setdefault(main, {})
            state[name] = value.view_as(main).to(main.dtype)
            if step is not None:
                state["step"] = torch.tensor(float(step))   # host: torch's Adam keeps its step count there
    restore_common(args, optimizer, opt_param_scheduler, common, load_rng)
    return common["args"], loaded.get("rng_state")
