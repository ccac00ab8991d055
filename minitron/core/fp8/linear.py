"""A tensor-parallel linear layer's three GEMMs with fp8 inputs, as Transformer Engine runs them.

Forward  Y  = X W^T      X: e4m3, W: e4m3
Backward dX = dY W       dY: e4m3, or e5m2 under --fp8-format hybrid
         dW = dY^T X     the fp8 X and W kept from forward (TE's fp8 "wgrad")

What autograd keeps for backward is the fp8 X and the fp8 W with their 1/scale factors: one
byte per element where the unquantized layer keeps the input in the training dtype. Under
mxfp8 each of X, W and dY is cast once per GEMM it enters, its blocks along the dimension that
GEMM sums over (``_casts``), and what is kept is the cast the backward needs, with one e8m0
byte per 32 elements. The bias gradient is summed from the unquantized dY, as TE's fused
cast-and-dbias kernel does.

The tensor-parallel communication is the unquantized layer's (layers.py), in the same places:
the input gradient's all-reduce or, with sequence parallelism, its reduce-scatter. Under
sequence parallelism the input is cast *before* the all-gather, so the gather moves one byte
per element (TE's fp8 all-gather): every TP rank casts its rows with the same scale (mxfp8:
its rows' own blocks, whose exponents are gathered with them).

The GEMM itself: on a CUDA device that has fp8 tensor cores (compute capability 8.9+), with
per-tensor scales and shapes torch._scaled_mm takes, the fp8 bytes go to it with the two 1/scale factors and the
tensor core accumulates in fp32. Everywhere else (the CPU, always) both operands are
dequantized to fp32 and multiplied there: the same products of the same fp8 values, summed in
fp32 in a different order, with 1/scale applied to each element instead of to each sum.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minitron.core.fp8.recipes import FORMATS, MXScaling, dequantize
from minitron.trace import traced
from minitron.trace.recorder import short_value


def _grad_args(ctx, grad_output):
    """What the traced backward records (as layers.py's does; imported from there it would be a cycle)."""
    return {"grad_output": short_value(grad_output)}


def _scaled_mm_takes(a: torch.Tensor, b: torch.Tensor) -> bool:
    """torch._scaled_mm's conditions: CUDA with fp8 tensor cores, sizes in multiples of 16, and
    not two e5m2 operands (cuBLAS has no such kernel)."""
    if not (a.is_cuda and hasattr(torch, "_scaled_mm")):
        return False
    if torch.cuda.get_device_capability(a.device) < (8, 9):
        return False
    e5m2 = FORMATS["e5m2"][0]
    return (a.dtype != e5m2 or b.dtype != e5m2) and all(n % 16 == 0 for n in (*a.shape, b.shape[0]))


def fp8_gemm(a: torch.Tensor, a_inv: torch.Tensor, b: torch.Tensor, b_inv: torch.Tensor,
             out_dtype: torch.dtype) -> torch.Tensor:
    """(a / a_scale) @ (b / b_scale)^T for fp8 a: [m, k], b: [n, k], in out_dtype."""
    if a_inv.numel() == 1 and b_inv.numel() == 1 and _scaled_mm_takes(a, b):   # per-tensor scales only
        return torch._scaled_mm(a.contiguous(), b.contiguous().t(), scale_a=a_inv.float(), scale_b=b_inv.float(),
                                out_dtype=out_dtype)
    return F.linear(dequantize(a, a_inv), dequantize(b, b_inv)).to(out_dtype)


def _gather_fp8(q: torch.Tensor, group) -> torch.Tensor:
    """All-gather the sequence (first) dimension of an fp8 tensor, as bytes (gloo and NCCL
    move uint8; fp8 dtypes are not theirs to know)."""
    out = torch.empty((q.shape[0] * group.size(), *q.shape[1:]), dtype=torch.uint8, device=q.device)
    torch.distributed.all_gather_into_tensor(out, q.contiguous().view(torch.uint8), group=group)
    return out.view(q.dtype)


def _2d(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1, t.size(-1))


def _casts(slot, x: torch.Tensor, group=None):
    """x [rows, cols] in fp8 for the GEMM that sums over its columns, and for the one that sums
    over its rows: a per-tensor recipe's one cast serves both; MXFP8 blocks along each."""
    if isinstance(slot, MXScaling):
        return slot.quantize(x, dim=1), slot.quantize(x, dim=0)
    cast = slot.quantize(x, group)
    return cast, cast


def _gathered(cast, group, sequence_parallel: bool):
    """An fp8 input and its scale with the whole sequence: per-tensor scales are shared already,
    MXFP8's exponents are gathered with the bytes."""
    if not sequence_parallel:
        return cast
    q, inv = cast
    return _gather_fp8(q, group), (_gather_fp8(inv, group) if inv.dim() else inv)


def _into_main_grad(weight, grad_weight):
    """An fp8 parameter's gradient: autograd would cast it to fp8, the parameter's dtype, so it
    is added to the DDP buffer's main_grad here (TE's fused wgrad accumulation) and autograd
    gets a placeholder of the right shape, so that DDP's hook still sees the parameter ready
    (and drops the placeholder: grad_added_to_main_grad)."""
    if not hasattr(weight, "main_grad"):
        raise RuntimeError("an fp8 parameter (--fp8-param-gather) needs DDP's main_grad buffer to take its gradient")
    weight.main_grad.add_(grad_weight)
    return torch.zeros((), dtype=weight.dtype, device=weight.device).expand(weight.shape)


class Fp8LinearWithAsyncCommunication(torch.autograd.Function):
    """LinearWithGradAccumulationAndAsyncCommunication (layers.py) with fp8 GEMM inputs."""

    @staticmethod
    def forward(ctx, input_, weight, bias, slots, allreduce_dgrad, sequence_parallel, group):
        # tensorwise: the sequence-parallel rows share one amax over the TP group (TE's rule)
        x_rows, x_cols = _casts(slots["input"], _2d(input_), group if sequence_parallel else None)
        # --fp8-param-gather: the weight is fp8 already, gathered so, with its 1/scale (param_gather.py)
        fp8_param = hasattr(weight, "fp8_scale_inv")
        w_rows, w_cols = ((weight.detach(), weight.fp8_scale_inv),) * 2 if fp8_param else _casts(slots["weight"], weight)
        total, total_inv = _gathered(x_rows, group, sequence_parallel)
        out = fp8_gemm(total, total_inv, *w_rows, torch.float32)
        if bias is not None:
            out = out + bias.float()
        ctx.save_for_backward(*x_cols, *w_cols)   # fp8 copies: one byte per element (+ scales)
        ctx.slots, ctx.group, ctx.use_bias = slots, group, bias is not None
        ctx.allreduce_dgrad, ctx.sequence_parallel = allreduce_dgrad, sequence_parallel
        ctx.input_shape, ctx.input_dtype = input_.shape, input_.dtype
        ctx.weight_dtype = weight.fp8_nominal_dtype if fp8_param else weight.dtype
        ctx.fp8_param = weight if fp8_param else None
        rows = total.size(0) // _2d(input_).size(0) * input_.size(0)   # the sequence, gathered
        return out.to(input_.dtype).reshape(rows, *input_.shape[1:-1], weight.size(0))

    @staticmethod
    @traced(args=_grad_args)
    def backward(ctx, grad_output):
        q_x, x_inv, q_w, w_inv = ctx.saved_tensors
        group, need_wgrad = ctx.group, ctx.needs_input_grad[1]
        (q_g, g_inv), (q_gt, gt_inv) = _casts(ctx.slots["grad_output"], _2d(grad_output))
        grad_input = fp8_gemm(q_g, g_inv, q_w.t(), w_inv.t(), ctx.input_dtype)   # dX = dY W
        grad_input = grad_input.reshape(*grad_output.shape[:-1], q_w.size(1))
        handle = None
        if ctx.allreduce_dgrad:                        # f's all-reduce, overlapping dL/dW
            handle = torch.distributed.all_reduce(grad_input, group=group, async_op=True)
        elif ctx.sequence_parallel:                    # sum and keep my rows, overlapping dL/dW
            summed = grad_input
            grad_input = torch.empty(ctx.input_shape, dtype=ctx.input_dtype, device=summed.device)
            handle = torch.distributed.reduce_scatter_tensor(grad_input, summed.contiguous(),
                                                             group=group, async_op=True)
        grad_weight = None
        if need_wgrad:                                 # dW = dY^T X, from the fp8 X kept
            total, total_inv = _gathered((q_x, x_inv), group, ctx.sequence_parallel)
            grad_weight = fp8_gemm(q_gt.t(), gt_inv.t(), total.t(), total_inv.t(), ctx.weight_dtype)
        grad_bias = _2d(grad_output).sum(dim=0) if ctx.use_bias else None
        if grad_weight is not None and ctx.fp8_param is not None:
            grad_weight = _into_main_grad(ctx.fp8_param, grad_weight)
        if handle is not None:
            handle.wait()
        return grad_input, grad_weight, grad_bias, None, None, None, None
