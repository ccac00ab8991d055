"""--fp8-param-gather: the weights of the quantized linears are kept in fp8, and the distributed
optimizer all-gathers them as fp8 bytes (Megatron's fp8_param / DDP's fp8_param_gather, built on
Transformer Engine's fp8 parameters).

Without the flag each rank gathers the bf16 weights after the optimizer step (2 bytes an
element) and every micro-batch's forward casts them to fp8 again. With it:

* at build time (Megatron opens TE's fp8_model_init around the transformer layers) each
  quantized linear's weight becomes an fp8 tensor with a 1/scale beside it, cast once with the
  weight slot's scale; the bf16 value it was cast from is kept until the optimizer has made its
  fp32 main copy of it (TE's preserve_high_precision_init_val), so both runs start from the
  same main weights;
* after each step every rank casts *its shard* of the updated main weights
  (``quantize_param_shard``, TE's cast_master_weights_to_fp8) straight into the fp8 byte
  buffer, and the all-gather moves one byte an element;
* the forward multiplies with the gathered fp8 weight as it is (core/fp8/linear.py); the
  weight gradient goes straight into ``main_grad`` (autograd would cast a gradient to the
  parameter's own dtype, fp8), as TE's fused wgrad accumulation puts it there.

The scale of a shard's cast. No rank sees the whole weight, yet all shards must be cast with one
scale and the weight's amax must enter its slot as if it had been cast whole:
* delayed: the shards are cast with the slot's current scale (the same on every rank: the
  histories agree); then each rank's shard amaxes, packed in one tensor, are all-reduced (max)
  and entered in the histories. TE reduces them over the data-parallel group here and over the
  amax reduction group (tp x dp x cp) at the end of the next forward; minitron's slots reduce
  over the latter at once, and the max of maxes is the same number;
* tensorwise: the shard amaxes are reduced (max) over the data-parallel group first, and the
  scale fp8_max / amax is chosen from the whole weight's amax before any shard is cast.
Either way the main shard is first rounded to the model's dtype (bf16), as TE does "to keep
numerical consistency": without the flag that bf16 weight is what the forward casts. So the
gathered fp8 weight is, bit for bit, what the forward without the flag would have cast.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from minitron.core.fp8.recipes import FORMATS, DelayedScaling, current_scale, quantize

FP8_WEIGHT = "e4m3"   # weights are e4m3 under both --fp8-format choices
FP8_WEIGHT_DTYPE = FORMATS[FP8_WEIGHT][0]


def is_fp8_param(param) -> bool:
    return param.dtype == FP8_WEIGHT_DTYPE


def keep_fp8_params(chunk, config) -> list:
    """Turn the weight of every linear that runs in fp8 (those inside the transformer block)
    into an fp8 parameter, cast with its slot's first scale. Returns the new parameters."""
    # lazy: the layers import fp8/linear.py, which imports this module (a cycle at import time)
    from minitron.core.fp8_utils import fp8_quantizers, get_fp8_context
    from minitron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
    from minitron.core.transformer.transformer_block import TransformerBlock

    linears = [layer for block in chunk.modules() if isinstance(block, TransformerBlock)
               for layer in block.modules() if isinstance(layer, (ColumnParallelLinear, RowParallelLinear))]
    params, inits = [], []
    with get_fp8_context(config):
        for layer in linears:
            slots = fp8_quantizers(layer)   # made now: the weight's slot scales the first cast
            old = layer.weight
            if old is None:   # a layer handed its weight at call time keeps it in the training dtype
                continue
            new = torch.nn.Parameter(torch.empty_like(old, dtype=FP8_WEIGHT_DTYPE), requires_grad=old.requires_grad)
            new.__dict__.update(old.__dict__)   # tensor-parallel attributes
            new.fp8_meta = slots["weight"]      # TE: the weight's quantizer
            new.fp8_nominal_dtype = old.dtype   # what it stands for (TE's Float8Tensor.dtype)
            new.fp8_init_val = old.detach().clone()   # until the optimizer copies it (see above)
            new.grad_added_to_main_grad = True      # the layer adds its gradient to main_grad itself
            layer.weight = new
            params.append(new)
            inits.append(new.fp8_init_val.view(-1))
    if params and params[0].is_meta:   # --init-model-with-meta-device: cast as each unit is built
        # (fsdp/meta_init.py); a shape has no numbers to cast, nor an amax to record
        return params
    quantize_param_shard(params, inits, [0] * len(params), None)
    return params


@torch.no_grad()
def quantize_param_shard(model_params, main_params, start_offsets, data_parallel_group, into=None) -> None:
    """Cast each main shard (None where this rank holds none of that weight) into the fp8
    parameter's bytes at its offset, or into ``into``'s tensor for it (Megatron-FSDP: the
    rank's fp8 shard, where the parameter's own bytes may be freed), and set every parameter's
    1/scale. Every rank of the amax group (delayed) or of ``data_parallel_group`` (tensorwise)
    calls this with the same parameters in the same order: the amaxes travel in one packed
    all-reduce."""
    if not model_params:
        return
    device = model_params[0].device
    highs = [None if main is None else main.to(p.fp8_nominal_dtype) for p, main in zip(model_params, main_params)]
    amaxes = torch.stack([torch.zeros((), device=device) if h is None or not h.numel()
                          else h.abs().amax().float() for h in highs])
    delayed = isinstance(model_params[0].fp8_meta, DelayedScaling)
    if delayed:
        scales = [p.fp8_meta.scale.to(device) for p in model_params]
    else:   # tensorwise: the whole weight's amax first, so every shard takes the same scale
        if data_parallel_group is not None and dist.get_world_size(data_parallel_group) > 1:
            dist.all_reduce(amaxes, op=dist.ReduceOp.MAX, group=data_parallel_group)
        scales = list(current_scale(amaxes, FP8_WEIGHT).unbind())
    for i, (p, high, start, scale) in enumerate(zip(model_params, highs, start_offsets, scales)):
        if high is not None:
            out = p.detach().view(-1)[start:start + high.numel()] if into is None else into[i]
            out.copy_(quantize(high, scale, FP8_WEIGHT))
        p.fp8_scale, p.fp8_scale_inv = scale, scale.reciprocal()   # the scale of the bytes now held
        if not delayed:
            p.fp8_meta.scale = scale
    if delayed:
        group = model_params[0].fp8_meta.group
        if group is not None and dist.get_world_size(group) > 1:
            dist.all_reduce(amaxes, op=dist.ReduceOp.MAX, group=group)
        for p, amax in zip(model_params, amaxes.unbind()):
            p.fp8_meta.record(amax.clone(), reduced=True)


def take_init_val(param, start: int, end: int) -> torch.Tensor:
    """The fp32 main shard of an fp8 parameter: from the high-precision value it was cast from."""
    return param.fp8_init_val.view(-1)[start:end].clone().float()


def dequantized_shard(param, start: int, end: int) -> torch.Tensor:
    """What the fp8 bytes stand for, in fp32 (a checkpoint's weights, reloaded into main shards)."""
    return param.detach().view(-1)[start:end].float() * param.fp8_scale_inv
