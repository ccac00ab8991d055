"""The optimizer's state as sharded tensors: each moment shaped, cut and keyed like its parameter.

Adam keeps, per parameter, two moments (exp_avg, exp_avg_sq) and, for a 16-bit model, an fp32
main copy. Each has its parameter's shape, so it is cut the way the parameter is: the same
offsets, the same replica ids, the same factory for SwiGLU's fc1. Keyed
``optimizer.state.<name>.<parameter's key>`` (Megatron's names), the optimizer reshards with
the model, at any tp / pp / dp.

The distributed optimizer (ZeRO-1) holds only a flat slice of each parameter's state, cut at
bucket boundaries that move with the data-parallel size. Before a save, each data-parallel
group therefore puts each parameter's slices back together (one all-reduce of zero-padded
slices: the bytes of the full state, once), and each rank keeps and writes only its block of
the rows, so a save holds about 1/dp of the state plus one parameter (measured at dp 4: 468 KB
a rank instead of the whole 1.87 MB). After a load, each rank keeps its own slice. Megatron
writes the flat slices as they are ("fully_sharded_model_space" with flattened ranges); we trade
that save-time traffic for one picture of the state that any layout can read.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state
from minitron.core.dist_checkpointing.mapping import ShardedTensor, ShardedTensorFactory


def _main_params(optimizer) -> list:
    """[(model param, the tensor torch's optimizer steps for it or None, flat range or None)].

    The distributed optimizer lists every parameter of its buffers, owned or not, in the
    buffers' order, the same on every data-parallel rank: the all-reduces below pair up."""
    if hasattr(optimizer, "param_range_map"):   # DistributedOptimizer: flat shards
        shards = dict(optimizer._all_pairs())
        return [(p, shards.get(p), optimizer.param_range_map.get(p, (0, 0)))
                for buffer in optimizer.buffers for p in buffer.params]
    out = [(param, param.main_param, None) for group in getattr(optimizer, "float16_groups", []) for param in group]
    mains = {id(main) for _, main, _ in out}
    out += [(param, param, None) for group in optimizer.optimizer.param_groups for param in group["params"]
            if id(param) not in mains]
    return out


def _dp_group(param):
    return (parallel_state.get_data_parallel_group(with_context_parallel=True) if getattr(param, "allreduce", True)
            else parallel_state.get_expert_data_parallel_group())


def _model_space(param, flat_range, value: torch.Tensor | None) -> torch.Tensor:
    """A tensor of the parameter's shape holding ``value`` (the whole state, or this rank's
    flat slice of it; every data-parallel rank's slices summed give the whole)."""
    if flat_range is None:
        local = _local(param)
        return (local.new_zeros(local.shape, dtype=torch.float32) if value is None
                else _local(value).clone().float().reshape(local.shape))
    # On the device the group's backend moves (NCCL: this rank's GPU, gloo: the host), as the
    # state itself is: a rank that owns nothing of this parameter has no slice to say where.
    full = torch.zeros(param.numel(), dtype=torch.float32, device=get_accelerator().current_device_name())
    if value is not None:
        full[flat_range[0]:flat_range[1]] = value.detach().float().view(-1)
    torch.distributed.all_reduce(full, group=_dp_group(param))
    return full.view(param.shape)


def _local(t: torch.Tensor) -> torch.Tensor:
    """This rank's part of ``t``: the rows of a DTensor (--use-torch-fsdp2's parameters and
    their moments, whose sharded entries describe those rows), else ``t`` itself; detached."""
    t = t.detach()
    return t.to_local() if hasattr(t, "device_mesh") else t


def _as(main: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """``local`` as ``main`` is held: a DTensor of the same placement when ``main`` is one (torch's
    Adam steps DTensor parameters with DTensor moments), else as it is."""
    if not hasattr(main, "device_mesh"):
        return local
    from torch.distributed.tensor import DTensor   # loaded already: main is one
    return DTensor.from_local(local, main.device_mesh, main.placements, shape=main.shape, stride=main.stride())


def _like(sh, key: str, data: torch.Tensor):
    """The parameter's sharded entry, renamed and pointing at ``data``."""
    if isinstance(sh, ShardedTensorFactory):
        return ShardedTensorFactory(key, data, sh.build_fn, sh.merge_fn, sh.replica_id)
    return replace(sh, key=key, data=data.reshape(sh.local_shape), dtype=data.dtype)


def _entries_by_param(model_sharded: dict, params) -> dict:
    """model param -> (its path in the model's sharded state dict, its entry), matched by storage.
    The path is unique per rank (two layers of a stage share a checkpoint key, not a path)."""
    def walk(tree, path):
        if isinstance(tree, dict):
            for k, v in tree.items():
                yield from walk(v, f"{path}{k}.")
        elif isinstance(tree, (ShardedTensor, ShardedTensorFactory)):
            yield path[:-1], tree
    by_ptr = {(sh.data.data_ptr(), tuple(sh.data.shape)): (path, sh) for path, sh in walk(model_sharded, "")}
    at = {p: (_local(p).data_ptr(), tuple(_local(p).shape)) for p in params}
    return {p: by_ptr[at[p]] for p in params if at[p] in by_ptr}


def state_names(optimizer) -> list[str]:
    """The per-parameter tensors torch's optimizer keeps (Adam: exp_avg, exp_avg_sq)."""
    for state in optimizer.optimizer.state.values():
        return sorted(k for k, v in state.items() if k != "step" and isinstance(v, torch.Tensor))
    return []


def optimizer_sharded_state_dict(optimizer, model_sharded: dict, names: list[str], loading: bool) -> dict:
    """{key: sharded entry} for every state tensor (zeros to load into when ``loading``)."""
    mains = _main_params(optimizer)
    entries = _entries_by_param(model_sharded, [param for param, _, _ in mains])
    out = {}
    for param, main, flat_range in mains:
        if param not in entries:
            continue
        path, sh = entries[param]
        state = optimizer.optimizer.state.get(main, {}) if main is not None else {}
        # A separate fp32 copy exists for 16-bit parameters only (an fp32 shard is a view of its param).
        for name in (["fp32_param"] if param.dtype != torch.float32 else []) + names:
            value = main if name == "fp32_param" else state.get(name)
            key = f"optimizer.state.{name}.{sh.key}"
            if loading:   # DCP reads into these, so they are made where the parameter lives
                entry = _like(sh, key, _model_space(param, None, None))
            else:
                entry = _like(sh, key, _model_space(param, flat_range, value))
                if flat_range is not None:
                    entry = _own_rows(entry, _dp_group(param))
            out[f"{name}.{path}"] = (entry, param, main, flat_range, name)
    return out


def _own_rows(entry, group) -> list[ShardedTensor]:
    """Of a state every rank of ``group`` holds whole (all-reduced), the share this rank writes:
    rank r of n keeps rows [r * ceil(R / n), (r + 1) * ceil(R / n)) of each chunk, copied out so
    that the whole can go, as the main replica of those rows. Rows, not Megatron's flat slices:
    DCP stores rectangular chunks, and any layout reads them back as it reads the weights."""
    n, r = torch.distributed.get_world_size(group), torch.distributed.get_rank(group)
    mine = []
    for sh in entry.build() if isinstance(entry, ShardedTensorFactory) else [entry]:
        rows = sh.local_shape[0]
        per = -(-rows // n)
        lo, hi = min(r * per, rows), min((r + 1) * per, rows)
        if lo == hi:
            continue   # fewer rows than ranks: this rank writes nothing of this chunk
        offset = list(sh.global_offset)
        offset[sh.prepend_axis_num] += lo
        data = sh.data[lo:hi].clone()
        # The data-parallel place of the replica id (the last) is 0: these rows are this rank's alone.
        replica = (*sh.replica_id[:-1], 0) if isinstance(sh.replica_id, tuple) else 0
        mine.append(replace(sh, data=data, local_shape=tuple(data.shape), global_offset=tuple(offset),
                            replica_id=replica))
    return mine


def restore_optimizer_state(optimizer, loaded: dict, described: dict, step) -> None:
    """Write what was loaded into torch's optimizer: each rank its own slice of each tensor."""
    for key, (_, param, main, flat_range, name) in described.items():
        if main is None:
            continue   # another data-parallel rank owns all of this parameter
        value, shape = loaded[key], _local(main).shape
        mine = value.reshape(shape) if flat_range is None else value.reshape(-1)[flat_range[0]:flat_range[1]]
        if name == "fp32_param":
            _local(main).copy_(mine.reshape(shape))
            continue
        state = optimizer.optimizer.state.setdefault(main, {})
        state[name] = _as(main, mine.reshape(shape).clone().to(main.dtype))
        if step is not None:
            state["step"] = torch.tensor(float(step))   # host: torch's Adam keeps its count on the CPU
