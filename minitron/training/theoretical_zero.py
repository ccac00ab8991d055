"""Memory and communication of a rank under ``--deepspeed``: what DeepSpeed's engine
(minitron/runtime/engine.py and zero/) holds and sends in place of DDP and Megatron's optimizer.

The model, its activations and its tensor-parallel traffic are Megatron's (the other
theoretical_*.py files); what changes is everything around the gradients. The engine hands the
torch optimizer's param groups (weights that decay, then biases and norms that do not) to ZeRO,
which, per group:

* stages 0-2 (stage_1_and_2.py): copies the group end to end into one flat buffer padded to a
  multiple of 2 x dp, cuts it into dp equal partitions (stage 0: one, the whole buffer), and
  keeps an fp32 master copy of *its* partition, which is all the torch optimizer ever sees;
* stage 3 (stage3.py): cuts every parameter on its own into dp pieces of ceil(n / dp), keeps
  its pieces end to end, and gathers a module's parameters only while the module runs.

So, with P the rank's parameter elements, flat the flat buffers' (padded), pieces the stage-3
pieces', e the weight's bytes (2 in bf16/fp16, 4 in fp32; the gradient has the weight's dtype)
and k the optimizer's fp32 moments (2 for Adam), a rank holds between micro-batches:

    stage      weights            gradients                 optimizer
    0          flat x e           P x e   (p.grad)          flat x (4 + 4k)
    1          flat x e           P x e   (p.grad)          flat/dp x (4 + 4k)
    2          flat x e           flat/dp x e (reduced)     flat/dp x (4 + 4k)
    3          pieces x e         pieces x e                pieces x (4 + 4k)

Communication on the data-parallel group (key ``dp``, the engine's mpu group) in one iteration
of m micro-batches: stage 0 all-reduces, stage 1 reduce-scatters each flat gradient once, at the
last micro-batch (with overlap_comm: reduces it bucket by bucket during that backward, as stage 2
does); stage 2 reduces every gradient during each backward, bucket by bucket (one all-reduce
of each bucket, or with use_multi_rank_bucket_allreduce false one reduce to each rank owning
some of its elements: P x e per micro-batch either way); stage 3 all-gathers each module's pieces
before its forward and again before its backward, and reduce-scatters each gradient (padded to
dp pieces); with full recomputation the recomputed layers gather a third time. The step then
all-reduces the overflow flag (fp32) and the squared norm (fp64) over dp and tp, and stages 1
and 2 all-gather the updated partitions. Stage 3 does not: the next forward gathers.
"""

from __future__ import annotations

import functools
import os

from minitron.runtime import DeepSpeedConfig
from minitron.runtime.zero.alignment import NCCL_START_ALIGNMENT_FACTOR
from minitron.training.theoretical_params import (
    DTYPE_BYTES, Param, chunk_layers, num_microbatches, optimizer_moments, recomputed_layers, round_up,
)
from minitron.training.theoretical_zeropp import stage3_comm, zeropp


def ds_config(args) -> DeepSpeedConfig:
    """The run's ds_config, resolved for its data-parallel size. The estimate asks for it once
    per rank role and stage, so it is read from disk once per (file, dp) while the file is
    unchanged: its modification time and size are part of the key, so an edited file is read
    again rather than answered from a stale copy."""
    path, dp = args.deepspeed_config, args.data_parallel_size
    if not isinstance(path, (str, os.PathLike)) or not os.path.isfile(path):
        return DeepSpeedConfig(path, world_size=dp)   # a dict, or a missing file it names
    stat = os.stat(path)
    return _read_ds_config(str(path), dp, stat.st_mtime_ns, stat.st_size)


@functools.lru_cache(maxsize=16)
def _read_ds_config(path: str, dp: int, mtime_ns: int, size: int) -> DeepSpeedConfig:
    return DeepSpeedConfig(path, world_size=dp)


def zero_stage(args) -> int:
    return ds_config(args).zero_optimization_stage


def param_groups(plist: list[Param]) -> list[list[Param]]:
    """_get_param_groups' two groups, in its order: matrices (weight decay), then the 1-D
    parameters (biases, norms) without it; an empty group is not made."""
    groups: tuple[list, list] = ([], [])
    for p in plist:
        groups[p.name.endswith(".bias") or "layernorm." in p.name].append(p)
    return [g for g in groups if g]


def _state_bytes(args) -> int:
    """Per partition element: the fp32 master and the torch optimizer's fp32 moments."""
    return 4 + 4 * optimizer_moments(args)


def zero_memory(args, plist: list[Param], dp_rank: int) -> tuple[int, dict]:
    """(parameters of the model on the rank, {"params", "grads", "optimizer"} bytes held)."""
    stage, dp = zero_stage(args), args.data_parallel_size
    e, state = DTYPE_BYTES[args.params_dtype], _state_bytes(args)
    groups = param_groups(plist)
    total = sum(p.numel for p in plist)
    if stage == 3:   # every parameter cut alone: my piece of each, end to end
        pieces = sum(-(-p.numel // dp) for g in groups for p in g)
        return total, _on_device(args, {"params": pieces * e, "grads": pieces * e, "optimizer": pieces * state})
    count = dp if stage >= 1 else 1
    numels = [sum(p.numel for p in g) for g in groups]
    flats = [round_up(n, NCCL_START_ALIGNMENT_FACTOR * dp) for n in numels]
    sizes = [f // count for f in flats]
    if stage == 2:   # a partition of the reduced gradient, made once some of it is real
        grads = sum(size for n, size in zip(numels, sizes) if dp_rank * size < n) * e
    else:            # every p.grad, accumulated over the micro-batches
        grads = total * e
    return total, _on_device(args, {"params": sum(flats) * e, "grads": grads, "optimizer": sum(sizes) * state})


def _on_device(args, held: dict) -> dict:
    """ZeRO-Offload: what offload_optimizer / offload_param (stage 3) keep on the host instead
    is not the device's (theoretical_offload.py counts it there)."""
    zero = ds_config(args).zero_config
    if zero.stage >= 1 and zero.offload_optimizer is not None and zero.offload_optimizer.device != "none":
        held["optimizer"] = 0
    if zero.stage == 3 and zero.offload_param is not None and zero.offload_param.device != "none":
        held["params"] = 0
    return held


def arrival_order(plist: list[Param]) -> list[Param]:
    """The order in which backward completes the gradients: reverse registration order (the
    last module's first), except that a linear adding its bias inside its own autograd function
    (linear_qkv; the others hand the bias back with skip_bias_add) returns the weight's gradient
    first and the bias's with it, so the weight's accumulates first."""
    order = list(reversed(plist))
    for i in range(len(order) - 1):
        bias, weight = order[i], order[i + 1]
        if bias.name.endswith("linear_qkv.bias") and weight.name == bias.name[:-4] + "weight":
            order[i], order[i + 1] = weight, bias
    return order


def _bucket_reduces(plist: list[Param], groups: list[list[Param]], dp: int, bucket_size: int,
                    all_reduce: bool = True) -> list[int]:
    """ZeRO-2's reductions of one backward (buckets.py): elements of each call. Gradients are
    taken as they arrive (the bytes do not depend on the order, the number of calls a little);
    one all-reduce of each bucket (``all_reduce``: use_multi_rank_bucket_allreduce), else one
    reduce per owner of a bucket's elements."""
    where, sizes = {}, []
    for i, g in enumerate(groups):
        offset = 0
        for p in g:
            where[p.name] = (i, offset)
            offset += p.numel
        sizes.append(round_up(offset, NCCL_START_ALIGNMENT_FACTOR * dp) // dp)
    calls, bucket, elements = [], [], 0

    def flush():
        if all_reduce:
            calls.append(sum(p.numel for p in bucket))
            return
        owned: dict[int, int] = {}
        for p in bucket:
            i, first = where[p.name]
            end = first + p.numel
            while first < end:
                owner = first // sizes[i]
                n = min(end, (owner + 1) * sizes[i]) - first
                owned[owner] = owned.get(owner, 0) + n
                first += n
        calls.extend(owned[k] for k in sorted(owned))

    for p in arrival_order(plist):
        if bucket and elements + p.numel > bucket_size:
            flush()
            bucket, elements = [], 0
        bucket.append(p)
        elements += p.numel
    if bucket:
        flush()
    return calls


def _layer_of(module: str) -> int | None:
    parts = module.split(".")
    return int(parts[2]) if parts[:2] == ["decoder", "layers"] else None


def _recomputed(args) -> set[int]:
    """Layers whose forward runs again in backward (--recompute-granularity full): at stage 3
    their modules gather once more. The first pass runs without grad, so it leaves no
    gather-before-backward behind; the recomputation does."""
    layers = chunk_layers(args, 0, 0)
    return set(layers[:recomputed_layers(args, len(layers))])


def largest_module(plist: list[Param]) -> int:
    """Elements of the module with the most parameters of its own: what stage 3 gathers at once
    (DeepSpeed's estimate_zero3_model_states_mem_needs calls it the largest layer)."""
    return max(sum(p.numel for p in params) for params in _modules(plist).values())


def _modules(plist: list[Param]) -> dict[str, list[Param]]:
    """Parameters by the module that registers them (stage 3 gathers per module)."""
    out: dict[str, list[Param]] = {}
    for p in plist:
        out.setdefault(p.name.rsplit(".", 1)[0], []).append(p)
    return out


def zero_comm(args, plist: list[Param], tally) -> None:
    """Add to ``tally`` (theoretical_comm._Tally) what the engine sends in one train_step:
    the gradients' reduction, the step's statistics, the partitions published, the loss."""
    cfg = ds_config(args)
    stage, dp, t = cfg.zero_optimization_stage, args.data_parallel_size, args.tensor_model_parallel_size
    m, e = num_microbatches(args), DTYPE_BYTES[args.params_dtype]
    groups = param_groups(plist)
    flats = [round_up(sum(p.numel for p in g), NCCL_START_ALIGNMENT_FACTOR * dp) for g in groups]
    if stage == 3 and zeropp(cfg):   # hpZ, qwZ: theoretical_zeropp.py's arithmetic, module by module
        piece = {p.name: -(-p.numel // dp) for p in plist}
        modules = [[piece[p.name] for p in params] for params in _modules(plist).values()]
        again = [[piece[p.name] for p in params] for name, params in _modules(plist).items()
                 if _layer_of(name) in _recomputed(args)]
        if not args.untie_embeddings_and_output_weights:
            again.append([piece["embedding.word_embeddings.weight"]])
        z3 = cfg.zero_config.stage3
        stage3_comm(tally, modules + again, [(p.numel,) for p in plist], dp=dp, e=e, m=m, dp_key="dp",
                    hpz=z3.zero_hpz_partition_size, quantized_weights=z3.zero_quantized_weights, again=len(again))
    elif stage == 3:
        piece = {p.name: -(-p.numel // dp) for p in plist}
        again = _recomputed(args)
        for name, params in _modules(plist).items():
            gathered = sum(piece[p.name] for p in params) * e
            tally.add("dp", gathered, 2 * m)            # before its forward, before its backward
            if _layer_of(name) in again:                 # and before the recomputed forward
                tally.add("dp", gathered, m)
        if not args.untie_embeddings_and_output_weights:  # the output layer reads the embedding
            tally.add("dp", piece["embedding.word_embeddings.weight"] * e, m)   # gathered again
        for p in plist:                                  # each gradient, padded to dp pieces
            tally.add("dp", piece[p.name] * dp * e, m)
    elif stage == 2 or (stage == 1 and cfg.zero_config.overlap_comm):
        # stage 2 in every backward; stage 1 with overlap_comm in the last micro-batch's only
        for n in _bucket_reduces(plist, groups, dp, cfg.zero_config.reduce_bucket_size,
                                 cfg.zero_config.use_multi_rank_bucket_allreduce or not (
                                     cfg.zero_config.contiguous_gradients and cfg.zero_config.reduce_scatter)):
            tally.add("dp", n * e, m if stage == 2 else 1)
    else:                                                # once, after the last micro-batch
        for flat in flats:
            tally.add("dp", flat * e)                    # all-reduce (0) or reduce-scatter (1)
    # engine.step: the overflow flag, the squared norm (fp64), over dp and then tp ...
    norm = cfg.zero_config.compute_grad_norm   # false (stages 1-2): no norm, no all-reduce of it
    tally.add("dp", 4)
    if dp > 1 and stage >= 1 and norm:
        tally.add("dp", 8)
    if t > 1:
        tally.add("tp", 4)
        if norm:
            tally.add("tp", 8)
    if stage in (1, 2) and dp > 1:                       # ... my updated partition, to everyone
        for flat in flats:
            tally.add("dp", flat // dp * e)
    tally.add("dp-cp", 8)   # train_step's loss: [sum, tokens], summed over the data-parallel ranks
