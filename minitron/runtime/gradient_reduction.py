"""How a gradient crosses the data-parallel group: the dtype it travels in, and where the mean's
1/dp is applied. Three ds_config keys decide it, as DeepSpeed 0.19.8 reads them:

    communication_data_type   "fp32", "fp16" or "bf16" (any case); absent: the gradients' own
                              dtype (the model's: fp16/bf16 when enabled, else fp32). Each
                              gradient is cast to it, summed in it, and cast back.
    prescale_gradients        true: divide by dp *before* the sum (no sum can overflow fp16);
                              false, the default: sum first, divide after ("postscale")
    gradient_predivide_factor f, postscale only: multiply by 1/f before the sum and by f/dp after,
                              a middle way between the two (f = dp is prescaling)

In exact arithmetic all of them give the mean; in floating point they round at other places,
which matters in 16 bits. Where DeepSpeed applies them (``where`` below):

    "engine"   stage 0: engine.allreduce_bucket, the rules above as written
    "zero"     ZeRO 1-2 with reduce_scatter false (zero's gradient_reduction_w_predivide): the
               same rules; its prescale is a division by dp rather than a multiplication by 1/dp
    "divide"   ZeRO 1-2 with reduce_scatter true, or contiguous_gradients false, and ZeRO 3
               (average_tensor, allreduce_bucket, reduce_scatter_coalesced): always divide by dp
               first. prescale_gradients and the factor change nothing there: at stage 1 DeepSpeed
               lets them through unread; at stages 2-3 with reduce_scatter it refuses them, and
               so does config.py (and at stage 3 without reduce_scatter it refuses a factor,
               which DeepSpeed would apply around its division but not undo when it equals dp).

A fourth, gradient_allreduce_op "sum" (DeepSpeed's gradient_average false), drops the mean
altogether: every path above sums and divides by nothing, predivide and prescale included (DeepSpeed
tests gradient_average before it reads either). The step then sees dp times the mean gradient.

torch_autocast (runtime/torch_autocast.py) replaces the first at ZeRO stages 1-3: each gradient
travels in its parameter's own mark (``for_param``), and communication_data_type is not read.

A rank hands ``to_wire`` its gradient, runs the collective (a sum) on what it got back, and takes
``from_wire`` of the result.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Optional

import torch

from minitron.runtime.torch_autocast import comm_dtype

DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


@dataclass(frozen=True)
class GradientReduction:
    dp: int = 1
    where: str = "divide"
    dtype: Optional[torch.dtype] = None     # None: the gradient's own
    prescale: bool = False
    predivide: float = 1.0
    # ZeRO 1-2: all-reduce the whole gradient and keep my partition of it, rather than reduce each
    # partition onto its owner (DeepSpeed: contiguous_gradients or reduce_scatter false)
    all_reduce: bool = False
    average: bool = True   # gradient_allreduce_op "mean"; False: "sum", nothing divides
    per_param_dtype: bool = False   # torch_autocast at ZeRO 1-3: the dtype is each parameter's

    def for_param(self, param: torch.Tensor) -> "GradientReduction":
        """The reduction of ``param``'s gradient: this one, or under autocast this one in the
        parameter's comm dtype (DeepSpeed's get_param_comm_dtype)."""
        if not self.per_param_dtype:
            return self
        return replace(self, dtype=comm_dtype(param))

    def to_wire(self, grad: torch.Tensor) -> torch.Tensor:
        """A tensor to sum over the ranks: ``grad`` itself when no cast is asked for (the
        collective then works in place), else a cast copy."""
        wire = grad if self.dtype in (None, grad.dtype) else grad.to(self.dtype)
        if not self.average:
            return wire
        if self.where == "divide":
            return wire.div_(self.dp)
        if self.prescale:
            return wire.mul_(1.0 / self.dp) if self.where == "engine" else wire.div_(self.dp)
        if self.predivide != 1.0:
            wire.mul_(1.0 / self.predivide)
        return wire

    def from_wire(self, summed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """The sum over the ranks -> the mean, in ``dtype`` (the gradient's)."""
        if self.average and self.where != "divide" and not self.prescale and self.predivide != self.dp:
            summed.mul_(self.predivide / self.dp)
        return summed if summed.dtype == dtype else summed.to(dtype)


def for_stage(config, dp: int) -> GradientReduction:
    """The reduction a DeepSpeedConfig asks for at its ZeRO stage (see the table above)."""
    zero = config.zero_config
    stage = zero.stage
    # DeepSpeed's BF16_Optimizer (bf16 weights, fp32 accumulation, stage 1: bf16_optimizer.py) is
    # reduced by the engine's all-reduce, as stage 0, in bf16 unless communication_data_type says
    bf16_optimizer = config.bfloat16_enabled and config.features.grad_accum_dtype == "fp32"
    if stage == 0 or bf16_optimizer:
        where = "engine"
    elif stage in (1, 2) and zero.contiguous_gradients and not zero.reduce_scatter:
        where = "zero"
    else:
        where = "divide"
    dtype = DTYPES[config.communication_data_type] if config.communication_data_type else \
        torch.bfloat16 if bf16_optimizer else None
    predivide = 1.0 if where == "divide" else config.gradient_predivide_factor
    all_reduce = where == "engine" or stage in (1, 2) and not (zero.contiguous_gradients and zero.reduce_scatter)
    average = config.engine_switches.gradient_allreduce_op == "mean"
    # stage 0's all-reduce is DeepSpeed's engine's, which reads no autocast mark
    per_param = config.torch_autocast.enabled and stage >= 1 and not bf16_optimizer
    return GradientReduction(dp, where, dtype, config.prescale_gradients and where != "divide", predivide, all_reduce,
                             average, per_param)
