"""ZeRO-Offload and ZeRO-Infinity in the estimate: which of a rank's bytes live in host memory
(or in swap files) instead of on the device, and what crosses between them in one train_step.
The runtime is minitron/runtime/zero/offload.py and swap_tensor/; theoretical_zero.py counts
what stays on the device (zero_memory leaves the offloaded parts out).

Per rank, with P my partition's elements (stages 1-2: flat/dp per group; stage 3: my pieces),
e the weights' bytes and k the optimizer's moments:

    offload_optimizer   host: P x (4 + 4k) (fp32 master and moments)
                        device -> host: P x 4 each step (my fp32 gradient partition)
                        host -> device: P x e each step (the updated weights), unless the
                        stage-3 pieces live on the host too (offload_param): then nothing
    offload_param       host: my stage-3 pieces, P x e
                        host -> device: my pieces of a module before each of its gathers
                        device -> host: P x e each step when the master stays on the device
    nvme (stage 3)      a sub-group whose fp32 master is at least max(1 MiB, aio.block_size) lives
                        in 1 + k files, each padded to aio.intra_op_parallelism KiB, read and
                        written once a step; smaller sub-groups stay in host memory.
                        offload_param nvme: the sub-groups past max_in_cpu elements (counted as
                        swap_tensor/partitioned_param_swapper.py counts them) keep each piece
                        of at least that floor in its own file (its e bytes, padded the same
                        way), read before each gather of it and written once a step; those
                        bytes leave "host"
"""

from __future__ import annotations

from minitron.runtime.zero.alignment import NCCL_START_ALIGNMENT_FACTOR
from minitron.runtime.zero.sub_groups import in_memory_sub_groups, sub_group_bounds
from minitron.training.theoretical_params import DTYPE_BYTES, Param, num_microbatches, optimizer_moments, round_up
from minitron.training.theoretical_zero import _layer_of, _modules, _recomputed, ds_config, param_groups

KEYS = ("host", "nvme", "to host", "to device", "nvme read", "nvme write")


def offloads(args) -> bool:
    zero = ds_config(args).zero_config
    return any(c is not None and c.device != "none" for c in (zero.offload_optimizer, zero.offload_param)) \
        and zero.stage >= 1


def _partitions(args, plist: list[Param]) -> list[int]:
    """My elements of each param group's partition (padding included: it is stepped too); at
    stage 3, of each sub-group's (sub_group_size cuts a group as zero/stage3.py cuts it)."""
    cfg = ds_config(args)
    stage, dp = cfg.zero_optimization_stage, args.data_parallel_size
    groups = param_groups(plist)
    if stage == 3:
        cut = cfg.zero_config.stage3.sub_group_size
        pieces = [[-(-p.numel // dp) for p in g] for g in groups]
        return [sum(ps[a:b]) for ps in pieces for a, b in sub_group_bounds(ps, cut)]
    return [round_up(sum(p.numel for p in g), NCCL_START_ALIGNMENT_FACTOR * dp) // dp for g in groups]


def offload_costs(args, plist: list[Param]) -> dict:
    """{"host", "nvme"} bytes held between steps and {"to host", "to device", "nvme read",
    "nvme write"} bytes of one train_step, for a rank holding ``plist``."""
    cfg = ds_config(args)
    zero, stage = cfg.zero_config, cfg.zero_optimization_stage
    opt = zero.offload_optimizer if zero.offload_optimizer is not None and zero.offload_optimizer.device != "none" \
        else None
    par = stage == 3 and zero.offload_param is not None and zero.offload_param.device != "none"
    e, k = DTYPE_BYTES[args.params_dtype], optimizer_moments(args)
    sizes = _partitions(args, plist)
    out = dict.fromkeys(KEYS, 0)
    if opt is not None:
        aio = cfg.aio_config
        for n in sizes:
            if opt.device == "nvme" and stage == 3 and n * 4 >= aio.min_swap_bytes:
                file = round_up(n * 4, aio.aligned_bytes)
                out["nvme"] += (1 + k) * file
                out["nvme read"] += (1 + k) * file
                out["nvme write"] += (1 + k) * file
            else:
                out["host"] += n * (4 + 4 * k)
        out["to host"] += sum(sizes) * 4
        if not par:
            out["to device"] += sum(sizes) * e
    if par:
        out["host"] += sum(sizes) * e
        gathers = _gathers(args, plist)
        out["to device"] += sum(_piece(args, p) * gathers.get(p.name, 0) for p in plist) * e
        if opt is None:
            out["to host"] += sum(sizes) * e
        for p, file in _param_files(args, plist):
            out["host"] -= _piece(args, p) * e
            out["nvme"] += file
            out["nvme read"] += file * gathers.get(p.name, 0)
            out["nvme write"] += file
    return out


def _piece(args, p: Param) -> int:
    return -(-p.numel // args.data_parallel_size)


def _param_files(args, plist: list[Param]) -> list:
    """(param, its swap file's bytes) of each piece offload_param nvme keeps in a file."""
    cfg = ds_config(args)
    zero, aio, e = cfg.zero_config, cfg.aio_config, DTYPE_BYTES[args.params_dtype]
    if cfg.zero_optimization_stage != 3 or zero.offload_param is None or zero.offload_param.device != "nvme":
        return []
    subs = [[g[a:b] for a, b in sub_group_bounds([_piece(args, p) for p in g], zero.stage3.sub_group_size)]
            for g in param_groups(plist)]
    sizes = [[sum(_piece(args, p) for p in sub) for sub in group] for group in subs]
    kept = in_memory_sub_groups(sizes, zero.offload_param.max_in_cpu)
    return [(p, round_up(_piece(args, p) * e, aio.aligned_bytes))
            for sub, in_memory in zip([sub for group in subs for sub in group], kept) if not in_memory
            for p in sub if _piece(args, p) * e >= aio.min_swap_bytes]


def _gathers(args, plist: list[Param]) -> dict:
    """How often one train_step gathers each parameter (as theoretical_zero's stage-3 gathers:
    each module before its forward and its backward, a recomputed layer once more, the tied
    embedding again for the output layer)."""
    m, again, out = num_microbatches(args), _recomputed(args), {}
    for name, params in _modules(plist).items():
        for p in params:
            out[p.name] = (3 if _layer_of(name) in again else 2) * m
    if not args.untie_embeddings_and_output_weights:
        out["embedding.word_embeddings.weight"] += m
    return out
