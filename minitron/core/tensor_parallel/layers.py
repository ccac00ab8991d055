"""The three tensor-parallel layers: a vocabulary-split embedding and two split linear layers.

For Y = X A + b with A of shape [in, out] (torch stores its transpose, [out, in]):

* ColumnParallelLinear splits A by output columns: A = [A_1 ... A_p]. Rank i computes
  Y_i = X A_i + b_i, a slice of Y's last dimension. Its input must be whole on every rank.
* RowParallelLinear splits A by input rows: A = [A_1; ...; A_p], X = [X_1 ... X_p]. Rank i
  computes the partial product X_i A_i; the sum over ranks is Y. Its input is a slice.

Put one after the other (MLP h -> 4h -> h, attention qkv -> proj) and the slice the first
produces is exactly the slice the second wants: one all-reduce in forward (the Row's sum) and
one in backward (the Column's input gradient) per pair, nothing in between.

Both linears multiply through ``linear_with_grad_accumulation_and_async_allreduce``, whose
autograd function does the Column's backward communication itself, overlapped with the
weight-gradient product; with sequence parallelism it also gathers the sequence itself, into
a borrowed buffer, and keeps only this rank's part of the input for backward.

Each weight is allocated on the rank's device and filled by weight_init.py's rule: on a CPU
rank (and on a GPU with ``--use-cpu-initialization``) every rank draws the *full* master weight
from the same CPU generator and keeps its slice, so the slices of a TP run put together are
bit-for-bit the weights of a serial run; on a GPU without the flag each rank draws its own slice
on the device, as Megatron does by default.
"""

from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.parameter import Parameter

from minitron.core import parallel_state
from minitron.core.fp8.linear import Fp8LinearWithAsyncCommunication
from minitron.core.fp8_utils import fp8_quantizers
from minitron.core.tensor_parallel.mappings import (
    _grad_args,
    copy_to_tensor_model_parallel_region, gather_from_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region, reduce_scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from minitron.core.tensor_parallel.utils import VocabUtility, divide
from minitron.core.tensor_parallel.weight_init import (  # noqa: F401 (set_...: Megatron's import path)
    init_device, initialize_affine_weight, set_tensor_model_parallel_attributes,
)
from minitron.trace import traced
from minitron.trace.recorder import short_value


def param_is_not_tensor_parallel_duplicate(param: torch.Tensor) -> bool:
    """True for a slice, or for a replicated parameter on TP rank 0: count each value once."""
    if not getattr(param, "tensor_model_parallel", False) and not getattr(param, "allreduce", True):
        # an MoE expert's weight, whole on its rank: replicated over the *expert* tp group
        return parallel_state.get_expert_tensor_parallel_group().rank() == 0
    return getattr(param, "tensor_model_parallel", False) or (
        parallel_state.get_tensor_model_parallel_rank() == 0)


def _layer_args(self, input_, weight=None, runtime_gather_output=None):
    """What a traced linear layer records: its input and the weight slice it multiplies by."""
    w = weight if weight is not None else self.weight
    return {"input": short_value(input_), "weight": short_value(w)}


def _all_gather_sequence(input_: torch.Tensor, group, async_op: bool = False):
    """All-gather the sequence (first) dimension into the global buffer "mpu": (tensor, handle)."""
    shape = list(input_.shape)
    shape[0] *= group.size()
    total = parallel_state.get_global_memory_buffer().get_tensor(shape, input_.dtype, "mpu", input_.device)
    handle = torch.distributed.all_gather_into_tensor(total, input_.contiguous(), group=group,
                                                      async_op=async_op)
    return total, handle


class LinearWithGradAccumulationAndAsyncCommunication(torch.autograd.Function):
    """Y = X W^T + b, with the tensor-parallel communication of X's gradient done inside.

    Without sequence parallelism, ``allreduce_dgrad`` all-reduces dL/dX (what f's backward
    would do) and starts it *before* the weight gradient is computed, so the two overlap.

    With sequence parallelism, X arrives as this rank's s/t rows. Forward gathers the whole
    sequence into the shared buffer, multiplies, and saves only the local rows: autograd keeps
    s*b*h/t elements instead of s*b*h. Backward gathers them again (started before the input
    gradient's product, which does not need them), then reduce-scatters dL/dX (started before
    the weight gradient's product). One more all-gather per layer buys (t-1)/t of the input.

    Megatron's ``gradient_accumulation_fusion`` adds the weight gradient straight into the
    fp32 ``main_grad`` with a CUDA kernel (APEX's fused_weight_gradient_mlp_cuda); minitron
    has no such kernel, returns the gradient to autograd, and lets the DDP buffer take it.
    """

    @staticmethod
    def forward(ctx, input_, weight, bias, gradient_accumulation_fusion, allreduce_dgrad,
                sequence_parallel, group):
        if gradient_accumulation_fusion:
            raise ValueError("gradient_accumulation_fusion needs a CUDA kernel minitron does not have")
        ctx.save_for_backward(input_, weight)          # with sequence parallelism: my rows only
        ctx.use_bias, ctx.group = bias is not None, group
        ctx.allreduce_dgrad, ctx.sequence_parallel = allreduce_dgrad, sequence_parallel
        total_input = _all_gather_sequence(input_, group)[0] if sequence_parallel else input_
        return F.linear(total_input, weight, bias)     # the buffer is free again after this

    @staticmethod
    @traced(args=_grad_args)
    def backward(ctx, grad_output):
        input_, weight = ctx.saved_tensors
        group, need_wgrad = ctx.group, ctx.needs_input_grad[1]
        handle = None
        if ctx.sequence_parallel and need_wgrad:       # the whole sequence again, for dL/dW
            total_input, handle = _all_gather_sequence(input_, group, async_op=True)
        else:
            total_input = input_
        grad_input = grad_output.matmul(weight)        # dL/dX: overlaps the gather
        if handle is not None:
            handle.wait()
        handle = None
        if ctx.allreduce_dgrad:                        # f's all-reduce, overlapping dL/dW
            handle = torch.distributed.all_reduce(grad_input, group=group, async_op=True)
        elif ctx.sequence_parallel:                    # sum and keep my rows, overlapping dL/dW
            summed, grad_input = grad_input, torch.empty_like(input_)
            handle = torch.distributed.reduce_scatter_tensor(grad_input, summed.contiguous(),
                                                             group=group, async_op=True)
        grad_2d = grad_output.reshape(-1, grad_output.size(-1))
        grad_weight = grad_2d.t().matmul(total_input.reshape(-1, total_input.size(-1))) if need_wgrad else None
        grad_bias = grad_2d.sum(dim=0) if ctx.use_bias else None
        if handle is not None:
            handle.wait()
        return grad_input, grad_weight, grad_bias, None, None, None, None


@traced(args=lambda input_, weight, bias, *a, **k: {"input": short_value(input_), "weight": short_value(weight),
                                                   "sequence_parallel": k.get("sequence_parallel")})
def linear_with_grad_accumulation_and_async_allreduce(input_, weight, bias, gradient_accumulation_fusion: bool,
                                                      allreduce_dgrad: bool, sequence_parallel: bool,
                                                      tp_group=None, fp8_slots=None):
    """Megatron's entry to the function above (same name, same arguments, fewer of them).
    ``fp8_slots`` (minitron's; inside an fp8 context): the layer's quantizers, and the GEMMs
    take fp8 inputs (core/fp8/linear.py) where Megatron's TE layers would."""
    group = parallel_state.get_tensor_model_parallel_group() if tp_group is None else tp_group
    if allreduce_dgrad and sequence_parallel:
        raise ValueError("allreduce_dgrad and sequence_parallel exclude each other: "
                         "with sequence parallelism the input gradient is reduce-scattered")
    if fp8_slots is not None:
        return Fp8LinearWithAsyncCommunication.apply(input_, weight, bias, fp8_slots, allreduce_dgrad,
                                                     sequence_parallel, group)
    return LinearWithGradAccumulationAndAsyncCommunication.apply(
        input_, weight, bias, gradient_accumulation_fusion, allreduce_dgrad, sequence_parallel, group)


class VocabParallelEmbedding(torch.nn.Module):
    """An embedding table split by vocabulary rows: rank r owns ids [start, end).

    A rank looks up the ids it owns, writes zeros for the others, and the all-reduce adds the
    ranks' answers: exactly one rank contributed each token's row.
    """

    def __init__(self, num_embeddings: int, embedding_dim: int, *, init_method: Callable, config):
        super().__init__()
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        self.tp_size = parallel_state.get_tensor_model_parallel_world_size()
        self.vocab_start_index, self.vocab_end_index = VocabUtility.vocab_range_from_global_vocab_size(
            num_embeddings, parallel_state.get_tensor_model_parallel_rank(), self.tp_size)
        self.num_embeddings_per_partition = self.vocab_end_index - self.vocab_start_index
        self.weight = Parameter(torch.empty(self.num_embeddings_per_partition, embedding_dim,
                                            dtype=config.params_dtype, device=init_device()))
        initialize_affine_weight(self.weight, config, num_embeddings, embedding_dim,
                                 self.num_embeddings_per_partition, 0, init_method)

    def _lookup_local_slice(self, input_: torch.Tensor) -> torch.Tensor:
        """This rank's answer before the all-reduce: its rows, or zeros for ids it does not own."""
        if self.tp_size == 1:
            return F.embedding(input_, self.weight)
        outside = (input_ < self.vocab_start_index) | (input_ >= self.vocab_end_index)
        # Shift ids into local row numbers; send the foreign ones to row 0 (any valid row
        # would do) so the lookup stays in bounds, then zero what they fetched.
        local_ids = (input_ - self.vocab_start_index).masked_fill(outside, 0)
        output = F.embedding(local_ids, self.weight)
        return output.masked_fill(outside.unsqueeze(-1), 0.0)

    @traced(args=lambda self, input_: {"input_ids": short_value(input_),
                                        "vocab_range": [self.vocab_start_index, self.vocab_end_index]})
    def forward(self, input_: torch.Tensor) -> torch.Tensor:
        # (Megatron can instead reduce-scatter here, straight into sequence-parallel pieces,
        # when no position embedding is added afterwards; minitron always adds one.)
        return reduce_from_tensor_model_parallel_region(self._lookup_local_slice(input_))


def _zero_bias(size: int, config) -> Parameter:
    # Biases start at zero, so every rank can make its own without drawing random numbers.
    return Parameter(torch.zeros(size, dtype=config.params_dtype, device=init_device()))


class ColumnParallelLinear(torch.nn.Module):
    """Y = X A + b with A split by output columns; rank i holds A_i: [out/p, in] and b_i.

    Returns Megatron's pair (output, bias): with ``skip_bias_add`` the bias is handed back
    unadded, so the caller can fuse it into the next elementwise op (bias + GeLU, bias +
    dropout + residual). ``gather_output`` all-gathers Y's slices into the whole Y.
    """

    def __init__(self, input_size: int, output_size: int, *, config, init_method: Callable,
                 bias: bool = True, gather_output: bool = False, stride: int = 1,
                 skip_bias_add: bool = False, skip_weight_param_allocation: bool = False):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.gather_output, self.skip_bias_add = gather_output, skip_bias_add
        world_size = parallel_state.get_tensor_model_parallel_world_size()
        self.output_size_per_partition = divide(output_size, world_size, "output size")
        # With one rank there is no sequence to split: sequence parallelism means nothing.
        self.sequence_parallel = config.sequence_parallel and world_size > 1
        # Without it, the input gradient is a sum over the group (f's backward): the linear's
        # own backward all-reduces it. With it, its backward reduce-scatters instead.
        self.allreduce_dgrad = world_size > 1 and not self.sequence_parallel
        if skip_weight_param_allocation:
            self.weight = None  # the weight is passed to forward (the tied output layer)
        else:
            self.weight = Parameter(torch.empty(self.output_size_per_partition, input_size,
                                                dtype=config.params_dtype, device=init_device()))
            initialize_affine_weight(self.weight, config, output_size, input_size,
                                     self.output_size_per_partition, 0, init_method, stride)
        if bias:
            self.bias = _zero_bias(self.output_size_per_partition, config)
            set_tensor_model_parallel_attributes(self.bias, True, 0, stride)
        else:
            self.register_parameter("bias", None)

    @traced(args=_layer_args)
    def forward(self, input_: torch.Tensor, weight: torch.Tensor | None = None,
                runtime_gather_output: bool | None = None):
        if weight is None:
            if self.weight is None:
                raise RuntimeError("this ColumnParallelLinear shares its weight: pass weight= to forward")
            weight = self.weight
        elif weight.shape != (self.output_size_per_partition, self.input_size):
            raise RuntimeError(f"weight has shape {tuple(weight.shape)}, expected "
                               f"{(self.output_size_per_partition, self.input_size)}")
        if self.allreduce_dgrad or self.sequence_parallel:
            input_parallel = input_   # the linear's own backward does f's all-reduce (or more)
        else:
            input_parallel = copy_to_tensor_model_parallel_region(input_)
        bias = self.bias if not self.skip_bias_add else None
        output_parallel = linear_with_grad_accumulation_and_async_allreduce(
            input_parallel, weight, bias, gradient_accumulation_fusion=False,
            allreduce_dgrad=self.allreduce_dgrad, sequence_parallel=self.sequence_parallel,
            fp8_slots=fp8_quantizers(self))
        gather = self.gather_output if runtime_gather_output is None else runtime_gather_output
        output = gather_from_tensor_model_parallel_region(output_parallel) if gather else output_parallel
        return output, (self.bias if self.skip_bias_add else None)


class RowParallelLinear(torch.nn.Module):
    """Y = X A + b with A split by input rows; rank i holds A_i: [out, in/p] and all of b.

    Each rank's product X_i A_i is a partial sum of Y; the all-reduce (or, with sequence
    parallelism, the reduce-scatter) completes it. The bias is added after the sum, once.
    """

    def __init__(self, input_size: int, output_size: int, *, config, init_method: Callable,
                 bias: bool = True, input_is_parallel: bool = False, stride: int = 1,
                 skip_bias_add: bool = False):
        super().__init__()
        self.input_size, self.output_size = input_size, output_size
        self.input_is_parallel, self.skip_bias_add = input_is_parallel, skip_bias_add
        world_size = parallel_state.get_tensor_model_parallel_world_size()
        self.input_size_per_partition = divide(input_size, world_size, "input size")
        self.sequence_parallel = config.sequence_parallel and world_size > 1
        if self.sequence_parallel and not input_is_parallel:
            raise ValueError("RowParallelLinear with sequence_parallel needs input_is_parallel=True")
        self.weight = Parameter(torch.empty(output_size, self.input_size_per_partition,
                                            dtype=config.params_dtype, device=init_device()))
        initialize_affine_weight(self.weight, config, output_size, input_size,
                                 self.input_size_per_partition, 1, init_method, stride)
        if bias:
            self.bias = _zero_bias(output_size, config)
            # Replicated, but under sequence parallelism each rank adds it to a different part
            # of the sequence, so its gradient is partial: finalize_model_grads must all-reduce
            # every parameter marked like this across the TP group.
            self.bias.sequence_parallel = self.sequence_parallel
        else:
            self.register_parameter("bias", None)

    @traced(args=_layer_args)
    def forward(self, input_: torch.Tensor):
        input_parallel = input_ if self.input_is_parallel else scatter_to_tensor_model_parallel_region(input_)
        # No communication inside: the row-parallel input gradient is already this rank's own.
        output_parallel = linear_with_grad_accumulation_and_async_allreduce(
            input_parallel, self.weight, None, gradient_accumulation_fusion=False,
            allreduce_dgrad=False, sequence_parallel=False, fp8_slots=fp8_quantizers(self))
        if self.sequence_parallel:
            output = reduce_scatter_to_sequence_parallel_region(output_parallel)
        else:
            output = reduce_from_tensor_model_parallel_region(output_parallel)
        if self.skip_bias_add:
            return output, self.bias
        return (output + self.bias if self.bias is not None else output), None
