"""What Megatron-FSDP (--use-megatron-fsdp) holds and sends per rank, from the arguments alone.

The units are core/distributed/fsdp's, per model chunk: with optim_grads_params each transformer
layer (with, beside it, a unit of its experts cut over the expert-data-parallel group, and one
of its fp8 weights under --fp8-param-gather); the tied embedding where two pipeline stages hold
it; and the rest (embedding, final norm, output layer; with the other strategies every
parameter), one unit per kind (dense, experts, fp8), cut at DDP's bucket size with
--overlap-grad-reduce. A unit over a group of g ranks is laid
out as core/distributed/fsdp/buffer_index.py lays it out, from each parameter's elements and row
width: P elements, chunk gaps and end padding included (sharded: a multiple of g chunks; no_shard:
no padding), cut into g shards of S = P/g, of which rank r owns [r*S, (r+1)*S) and steps the
parameters' elements inside it. Per strategy (e bytes per element: the model's, 1 for an fp8
unit):

    strategy             params                         grads     optimizer (fp32)
    no_shard             P e                            P g       n (all the unit's elements)
    optim                P e                            P g       owned
    optim_grads          P e                            S g       owned
    optim_grads_params   S e + the units in flight      S g       owned

(g: the gradients' bytes, 4 with --accumulate-allreduce-grads-in-fp32 or as
--megatron-fsdp-main-grads-dtype says, and the reductions send --megatron-fsdp-grad-comm-dtype's;
the optimizer keeps Adam's moments, and a main copy when --megatron-fsdp-main-params-dtype differs
from the model's (fp32 for a 16-bit model, Megatron's default), of each element it steps; an
fp8 weight's main copy is fp32 always.)

In flight, for optim_grads_params, are the units the chunk's own hooks gather (the rest and the
tied embedding: from the chunk's forward until their gradients are reduced) and one layer's
units at a time: the estimate's "params" is that peak. finalize_model_grads' sums run on the
pieces a rank owns (fsdp/finalize.py), so their bytes depend on the rank's place in dp.
Torch-free, like the rest of the estimator.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from minitron.core.distributed.distributed_data_parallel_config import resolve_bucket_size
from minitron.core.distributed.fsdp.buffer_index import BufferIndex, build_buffer_index, parameter_buckets
from minitron.training.theoretical_fp8 import _is_quantized_weight
from minitron.training.theoretical_moe import expert_data_parallel_size, has_experts
from minitron.training.theoretical_params import DTYPE_BYTES, _flag, chunks_of, model_params, num_microbatches, \
    optimizer_moments, recomputed_layers

_LAYER = re.compile(r"^(.*?layers\.\d+)\.")
REST, TIED = "(rest)", "(tied embedding)"


@dataclass(frozen=True)
class Unit:
    name: str
    params: tuple          # its Params (theoretical_params.Param), in order
    expert: bool           # cut over the expert-data-parallel group, not dp x cp
    fp8: bool              # --fp8-param-gather's one-byte weights
    layer: str | None      # the layer whose hooks gather it; None: the chunk's own hooks

    @property
    def numel(self) -> int:
        return sum(p.numel for p in self.params)

    def index(self, group: int, sharded: bool) -> BufferIndex:
        """The unit's buffer over ``group`` ranks, as FSDPUnit lays it out (a parameter's shape
        enters only as its elements and its row width)."""
        return build_buffer_index([(p.numel // p.row, p.row) for p in self.params], group, sharded)


def _fp8(args, p) -> bool:
    return bool(_flag(args, "fp8") and _flag(args, "fp8_param_gather")) and not p.expert and _is_quantized_weight(p)


def fsdp_units(args, pp_rank: int = 0, chunk: int = 0) -> list[Unit]:
    """The chunk's units in the wrapper's order: with optim_grads_params per layer its dense, fp8
    and expert units; then the rest in buckets by kind (every parameter, with the other
    strategies); then the tied embedding."""
    layers: dict[str, list] = {}
    tied, rest = [], []
    split = args.pipeline_model_parallel_size > 1 and not args.untie_embeddings_and_output_weights
    per_layer = args.data_parallel_sharding_strategy == "optim_grads_params"
    for p in model_params(args, pp_rank, chunk):
        found = _LAYER.match(p.name) if per_layer else None
        if found:
            layers.setdefault(found.group(1), []).append(p)
        elif split and p.shared_embedding:
            tied.append(p)
        else:
            rest.append(p)
    units = []
    for name, params in layers.items():
        for expert in (False, True):
            for fp8 in (False, True):
                mine = tuple(p for p in params if p.expert == expert and _fp8(args, p) == fp8)
                label = name + (" (experts)" if expert else "") + (" (fp8)" if fp8 else "")
                if mine:
                    units.append(Unit(label, mine, expert, fp8, name))
    # the wrapper's rule (fully_sharded_data_parallel.py): DDP's bucket size, sized from dense dp
    size = resolve_bucket_size(getattr(args, "ddp_bucket_size", None), getattr(args, "overlap_grad_reduce", False),
                               _dp(args), disable_bucketing=pp_rank > 0 or chunk > 0)
    kinds = [(p.expert, _fp8(args, p)) for p in rest]
    buckets = parameter_buckets(kinds, [p.numel for p in rest], size)
    for n, ((expert, fp8), members) in enumerate(buckets):
        label = REST + (f" {n}" if sum(key == (expert, fp8) for key, _ in buckets) > 1 else "")
        label += (" (experts)" if expert else "") + (" (fp8)" if fp8 else "")
        units.append(Unit(label, tuple(rest[i] for i in members), expert, fp8, None))
    units += [Unit(TIED, tuple(tied), False, False, None)] if tied else []
    return units


def _dp(args) -> int:
    return args.data_parallel_size * args.context_parallel_size


def _group(args, unit: Unit) -> int:
    return expert_data_parallel_size(args) if unit.expert else _dp(args)


_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}   # --megatron-fsdp-*-dtype; auto decides by the rule where used


def _grad_bytes(args, e: int) -> int:
    chosen = _BYTES.get(getattr(args, "megatron_fsdp_main_grads_dtype", "auto"))
    return chosen or (4 if args.accumulate_allreduce_grads_in_fp32 else e)


def _comm_bytes(args, e: int) -> int:
    """What a gradient reduction sends per element: --megatron-fsdp-grad-comm-dtype, else the gradients'."""
    return _BYTES.get(getattr(args, "megatron_fsdp_grad_comm_dtype", "auto")) or _grad_bytes(args, e)


def _index(args, unit: Unit) -> BufferIndex:
    return unit.index(_group(args, unit), args.data_parallel_sharding_strategy != "no_shard")


def _owned(args, unit: Unit, rank: int) -> list[int]:
    """Elements of each of the unit's parameters that the optimizer of the rank at ``rank`` in
    its group steps: those inside its shard (no_shard: all); gaps and padding are nobody's."""
    index = _index(args, unit)
    lo, hi = (0, index.size) if args.data_parallel_sharding_strategy == "no_shard" else index.shard(rank)
    return [max(0, min(hi, start + p.numel) - max(lo, start)) for p, start in zip(unit.params, index.offsets)]


def fsdp_memory(args, dp_rank: int, pp_rank: int = 0, expert_dp_rank: int = 0) -> tuple[int, dict]:
    """(parameters of the stage's chunks, {"params", "grads", "optimizer"} bytes) on the rank."""
    strategy, e = args.data_parallel_sharding_strategy, DTYPE_BYTES[args.params_dtype]
    # the optimizer's main pieces: a copy of their own unless they are the model's dtype
    main = _BYTES.get(getattr(args, "megatron_fsdp_main_params_dtype", "fp32")) or e
    g = _grad_bytes(args, e)
    numel = params = grads = optimizer = 0
    in_flight: dict = {}   # (chunk, its layer or None: the chunk's own hooks) -> bytes gathered with it
    for chunk in chunks_of(args):
        for unit in fsdp_units(args, pp_rank, chunk):
            ue, index = (1 if unit.fp8 else e), _index(args, unit)
            owned = sum(_owned(args, unit, expert_dp_rank if unit.expert else dp_rank))
            umain = 4 if unit.fp8 else main
            numel += unit.numel
            if strategy == "optim_grads_params":
                params += index.shard_size * ue
                where = (chunk, unit.layer)
                in_flight[where] = in_flight.get(where, 0) + index.size * ue
            else:
                params += index.size * ue
            grads += (index.shard_size if strategy in ("optim_grads", "optim_grads_params") else index.size) * g
            optimizer += owned * (umain * optimizer_moments(args) + (umain if umain != ue else 0))
    # each chunk's own units (a virtual stage's rest stays gathered while its micro-batches are
    # in flight), and one layer at a time of all chunks: a layer is freed after its forward
    params += sum(v for (_, layer), v in in_flight.items() if layer is None)
    params += max((v for (_, layer), v in in_flight.items() if layer is not None), default=0)
    return numel, {"params": params, "grads": grads, "optimizer": optimizer}


def fsdp_comm(args, tally, pp_rank: int = 0) -> None:
    """Add one train_step's data-parallel collectives to ``tally`` (theoretical_comm's: bytes
    per call, times calls), with the bytes each rank hands in: a gather's shard, a reduction's
    whole unit. What depends on the rank's dp place is fsdp_piece_sums'."""
    strategy, e = args.data_parallel_sharding_strategy, DTYPE_BYTES[args.params_dtype]
    g, m = _comm_bytes(args, e), num_microbatches(args)
    for chunk in chunks_of(args):
        units = fsdp_units(args, pp_rank, chunk)
        layers = list(dict.fromkeys(unit.layer for unit in units if unit.layer is not None))
        recomputed = set(layers[:recomputed_layers(args, len(layers))])
        for unit in units:
            key, ue, index = ("expt-dp" if unit.expert else "dp-cp"), (1 if unit.fp8 else e), _index(args, unit)
            if strategy == "no_shard":
                tally.add(key, index.size * g)                      # all-reduce, once per step
                continue
            # optim: one reduce-scatter per step; sharded gradients: one per micro-batch's backward
            tally.add(key, index.size * g, 1 if strategy == "optim" else m)
            if strategy == "optim_grads_params":
                # before forward and before backward; a recomputed layer once more (its rerun)
                tally.add(key, index.shard_size * ue, m * (3 if unit.layer in recomputed else 2))
            else:
                tally.add(key, index.shard_size * ue)             # the updated shards, after the step
    stats = "tp-pp" if strategy == "no_shard" else "intra-dist-opt"   # sharded: over every rank
    checks = (1 if args.fp16 or args.loss_scale is not None else 0) + (1 if args.clip_grad > 0 else 0)
    tally.add(stats, 4, checks)   # the loss scaler's Inf check, the gradient norm
    if has_experts(args):
        etp = args.expert_tensor_parallel_size or args.tensor_model_parallel_size
        if strategy == "no_shard" and etp * args.expert_model_parallel_size != args.tensor_model_parallel_size:
            tally.add("tp-ep-pp", 4, checks)   # whole replicas: the experts' statistics, as DDP's
        if args.moe_aux_loss_coeff > 0:   # track_moe_metrics: one value per layer, over pp, tp x cp, dp
            for key in ("pp", "tp-cp", "dp"):
                tally.add(key, args.num_layers * 4)
    if pp_rank == args.pipeline_model_parallel_size - 1:
        tally.add("dp-cp", 8)   # train_step's loss: [sum, tokens], summed over dp x cp


def fsdp_piece_sums(args, tally, pp_rank: int, dp_rank: int) -> None:
    """finalize_model_grads' sums on the rank's pieces (fsdp/finalize.py): the partial gradients
    over TP, in one all-reduce of the pieces it owns (none: no call); the tied embedding's
    piece over the first and last stage."""
    g = _grad_bytes(args, DTYPE_BYTES[args.params_dtype])
    partial = tied = 0
    for chunk in chunks_of(args):
        for unit in fsdp_units(args, pp_rank, chunk):
            for p, mine in zip(unit.params, _owned(args, unit, dp_rank)):
                if unit.name == TIED:
                    tied += mine
                elif p.sequence_parallel and not unit.expert:
                    partial += mine
    if args.tensor_model_parallel_size > 1 and partial:
        tally.add("tp", partial * g)
    if tied:
        tally.add("embd", tied * g)
