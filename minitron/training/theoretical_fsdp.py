"""What Megatron-FSDP (--use-megatron-fsdp) holds and sends per rank, from the arguments alone.

The units are core/distributed/fsdp's: each transformer layer, and the rest of the chunk
(embedding, final norm, output layer). A unit of n elements is padded to P = dp * ceil(n/dp)
and cut into dp shards of S = P/dp; the padding sits at the end of the unit, so rank r owns
the real elements [r*S, min((r+1)*S, n)). Per strategy (e bytes per element):

    strategy             params                         grads     optimizer (fp32)
    no_shard             P e                            P g       n
    optim                P e                            P g       owned
    optim_grads          P e                            S g       owned
    optim_grads_params   S e + the units in flight      S g       owned

(g: the gradients' bytes, 4 with --accumulate-allreduce-grads-in-fp32 or as
--megatron-fsdp-main-grads-dtype says, and the reductions send --megatron-fsdp-grad-comm-dtype's;
the optimizer keeps Adam's moments, and a main copy when --megatron-fsdp-main-params-dtype differs
from the model's (fp32 for a 16-bit model, Megatron's default), of each element it steps.)

In flight, for optim_grads_params, are the rest of the chunk (gathered from the model's
forward until the embedding's gradient is reduced) and one layer at a time: the estimate's
"params" is that peak. Torch-free, like the rest of the estimator.
"""

from __future__ import annotations

import re

from minitron.training.theoretical_params import DTYPE_BYTES, model_params, num_microbatches, optimizer_moments, \
    recomputed_layers

_LAYER = re.compile(r"^(.*?layers\.\d+)\.")
REST = "(rest)"


def fsdp_units(args, pp_rank: int = 0) -> dict[str, int]:
    """unit name -> its elements, in the order the model registers them (the rest last)."""
    units: dict[str, int] = {}
    rest = 0
    for p in model_params(args, pp_rank, 0):
        found = _LAYER.match(p.name)
        if found:
            units[found.group(1)] = units.get(found.group(1), 0) + p.numel
        else:
            rest += p.numel
    if rest:
        units[REST] = rest
    return units


def _dp(args) -> int:
    return args.data_parallel_size * args.context_parallel_size


def _shard(numel: int, dp: int) -> int:
    return -(-numel // dp)


_BYTES = {"fp32": 4, "bf16": 2, "fp16": 2}   # --megatron-fsdp-*-dtype; auto decides by the rule where used


def _grad_bytes(args, e: int) -> int:
    chosen = _BYTES.get(getattr(args, "megatron_fsdp_main_grads_dtype", "auto"))
    return chosen or (4 if args.accumulate_allreduce_grads_in_fp32 else e)


def _comm_bytes(args, e: int) -> int:
    """What a gradient reduction sends per element: --megatron-fsdp-grad-comm-dtype, else the gradients'."""
    return _BYTES.get(getattr(args, "megatron_fsdp_grad_comm_dtype", "auto")) or _grad_bytes(args, e)


def fsdp_memory(args, dp_rank: int) -> tuple[int, dict]:
    """(parameters of the model chunk, {"params", "grads", "optimizer"} bytes) on ``dp_rank``."""
    strategy, dp, e = args.data_parallel_sharding_strategy, _dp(args), DTYPE_BYTES[args.params_dtype]
    # the optimizer's main pieces: a copy of their own unless they are the model's dtype
    main = _BYTES.get(getattr(args, "megatron_fsdp_main_params_dtype", "fp32")) or e
    main_copy = main if main != e else 0
    units = fsdp_units(args)
    padded = {name: _shard(n, dp) * dp for name, n in units.items()}
    shard = {name: _shard(n, dp) for name, n in units.items()}
    if strategy == "no_shard":
        owned = sum(units.values())
    else:
        owned = sum(max(0, min(n, (dp_rank + 1) * shard[name]) - dp_rank * shard[name])
                    for name, n in units.items())
    if strategy == "optim_grads_params":
        layers = [padded[name] for name in units if name != REST]
        in_flight = padded.get(REST, 0) + max(layers, default=0)
        params = sum(shard.values()) + in_flight
    else:
        params = sum(padded.values())
    grads = sum(shard.values()) if strategy in ("optim_grads", "optim_grads_params") else sum(padded.values())
    return sum(units.values()), {"params": params * e, "grads": grads * _grad_bytes(args, e),
                                 "optimizer": owned * (main * optimizer_moments(args) + main_copy)}


def fsdp_comm(args, tally) -> None:
    """Add one train_step's data-parallel collectives to ``tally`` (theoretical_comm's: bytes
    per call, times calls), with the bytes each rank hands in: a gather's shard, a reduction's
    whole unit."""
    strategy, dp, e = args.data_parallel_sharding_strategy, _dp(args), DTYPE_BYTES[args.params_dtype]
    g, m = _comm_bytes(args, e), num_microbatches(args)
    units = fsdp_units(args)
    layers = [name for name in units if name != REST]
    recomputed = set(layers[:recomputed_layers(args, len(layers))])
    for name, n in units.items():
        shard = _shard(n, dp)
        if strategy == "no_shard":
            tally.add("dp-cp", shard * dp * g)                   # all-reduce, once per step
            continue
        # optim: one reduce-scatter per step; sharded gradients: one per micro-batch's backward
        reductions = 1 if strategy == "optim" else m
        tally.add("dp-cp", shard * dp * g, reductions)
        if strategy == "optim_grads_params":
            # before forward and before backward; a recomputed layer once more (its rerun)
            gathers = m * (3 if name in recomputed else 2)
            tally.add("dp-cp", shard * e, gathers)
        else:
            tally.add("dp-cp", shard * e)                        # the updated shards, after the step
    stats = "tp-pp" if strategy == "no_shard" else "intra-dist-opt"   # sharded: over every rank
    if args.fp16 or args.loss_scale is not None:   # the loss scaler's Inf check
        tally.add(stats, 4)
    if args.clip_grad > 0:   # the gradient norm
        tally.add(stats, 4)
    tally.add("dp-cp", 8)   # train_step's loss: [sum, tokens], summed over dp x cp
