"""The mappings that cut the first dimension (the sequence, or the tokens).

Megatron keeps these in mappings.py with the others; mappings.py re-exports every public name
here, so ``from minitron.core.tensor_parallel.mappings import gather_from_sequence_parallel_region``
reads as Megatron's. They have a file of their own only so that each file can be read in one
sitting: this one is about splitting a tensor's rows between ranks, evenly or not (the three
sequence-parallel rows of mappings.py's table).

The all-gather and the reduce-scatter also take uneven blocks (``output_split_sizes`` /
``input_split_sizes``: rank i's rows): MoE's dispatcher uses them over the expert tensor-
parallel group, where each rank holds as many tokens as its router chose.
"""

from __future__ import annotations

import warnings

import torch

from minitron.core import parallel_state
from minitron.core.tensor_parallel.utils import divide
from minitron.trace import traced
from minitron.trace.recorder import short_value

# torch 2.13 renames the two "into a flat tensor" collectives (to *_single) and warns on every
# call. We keep the names Megatron uses (and torch >= 2.4 all have), and silence only that.
warnings.filterwarnings(
    "ignore", message=r"`torch\.distributed\.(all_gather_into_tensor|reduce_scatter_tensor)` is deprecated",
    category=FutureWarning)


def _tp_group(group):
    return parallel_state.get_tensor_model_parallel_group() if group is None else group


def _grad_args(ctx, grad_output):
    """What a traced backward records: the shape of the gradient it received."""
    return {"grad_output": short_value(grad_output)}


# --- the raw collectives (no autograd) ------------------------------------------------------
def _split_along_first_dim(input_: torch.Tensor, group) -> torch.Tensor:
    """Keep this rank's slice of the first (sequence) dimension (no communication)."""
    if group.size() == 1:
        return input_
    local = divide(input_.size(0), group.size(), "sequence length (sequence parallelism)")
    start = group.rank() * local
    return input_[start:start + local].contiguous()


def _gather_along_first_dim(input_: torch.Tensor, group, output_split_sizes=None) -> torch.Tensor:
    """Concatenate every rank's tensor along the first dimension, in rank order. With
    ``output_split_sizes`` rank i holds that many rows; gloo's all-gather wants equal blocks,
    so each is padded to the longest and the padding cut off after."""
    if group.size() == 1:
        return input_
    rows = input_.size(0) if output_split_sizes is None else max(output_split_sizes)
    padded = input_.contiguous()
    if rows != input_.size(0):
        padded = input_.new_zeros((rows,) + tuple(input_.shape[1:]))
        padded[:input_.size(0)] = input_
    output = input_.new_empty((rows * group.size(),) + tuple(input_.shape[1:]))
    torch.distributed.all_gather_into_tensor(output, padded, group=group)
    if output_split_sizes is None:
        return output
    return torch.cat([output[i * rows:i * rows + n] for i, n in enumerate(output_split_sizes)])


def _reduce_scatter_along_first_dim(input_: torch.Tensor, group, input_split_sizes=None) -> torch.Tensor:
    """Sum over the group, and keep only this rank's slice of the first dimension of the sum
    (with ``input_split_sizes``, rank i's slice is that many rows: padded as above)."""
    if group.size() == 1:
        return input_
    if input_split_sizes is None:
        rows = divide(input_.size(0), group.size(), "sequence length (sequence parallelism)")
        padded = input_.contiguous()
    else:
        rows = max(input_split_sizes)
        padded = input_.new_zeros((rows * group.size(),) + tuple(input_.shape[1:]))
        for i, block in enumerate(torch.split(input_, input_split_sizes)):
            padded[i * rows:i * rows + input_split_sizes[i]] = block
    output = input_.new_empty((rows,) + tuple(input_.shape[1:]))
    torch.distributed.reduce_scatter_tensor(output, padded, group=group)
    return output if input_split_sizes is None else output[:input_split_sizes[group.rank()]]


# --- the autograd functions ---------------------------------------------------------------
class _ScatterToSequenceParallelRegion(torch.autograd.Function):
    """Keep my part of the sequence; backward gathers the sequence's gradient back together."""

    @staticmethod
    def forward(ctx, input_, group):
        ctx.group = group
        return _split_along_first_dim(input_, group)

    @staticmethod
    @traced(args=_grad_args)
    def backward(ctx, grad_output):
        return _gather_along_first_dim(grad_output, ctx.group), None


class _GatherFromSequenceParallelRegion(torch.autograd.Function):
    """All-gather the sequence before a column-parallel layer.

    Backward: the layer after the gather is tensor-parallel, so each rank's gradient for the
    full sequence is only its *partial* share (like f's backward). Summing them and keeping my
    part of the sequence is one reduce-scatter. If the computation after the gather is instead
    replicated (``tensor_parallel_output_grad=False``), the gradient is already whole: split.
    """

    @staticmethod
    def forward(ctx, input_, group, tensor_parallel_output_grad=True, output_split_sizes=None):
        ctx.group, ctx.output_split_sizes = group, output_split_sizes
        ctx.tensor_parallel_output_grad = tensor_parallel_output_grad
        return _gather_along_first_dim(input_, group, output_split_sizes)

    @staticmethod
    @traced(args=_grad_args)
    def backward(ctx, grad_output):
        if ctx.tensor_parallel_output_grad:
            return _reduce_scatter_along_first_dim(grad_output, ctx.group, ctx.output_split_sizes), None, None, None
        assert ctx.output_split_sizes is None, "uneven blocks are split only by a reduce-scatter"
        return _split_along_first_dim(grad_output, ctx.group), None, None, None


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """Sum the row-parallel partial outputs and keep my part of the sequence (g, cut in two).

    all-reduce = reduce-scatter + all-gather. Sequence parallelism stops after the first half:
    the layernorm and dropout that follow work on a slice of the sequence, and the all-gather
    is postponed to the next column-parallel layer's input.
    """

    @staticmethod
    def forward(ctx, input_, group, input_split_sizes=None):
        ctx.group, ctx.input_split_sizes = group, input_split_sizes
        return _reduce_scatter_along_first_dim(input_, group, input_split_sizes)

    @staticmethod
    @traced(args=_grad_args)
    def backward(ctx, grad_output):
        return _gather_along_first_dim(grad_output, ctx.group, ctx.input_split_sizes), None, None


# --- the public names ---------------------------------------------------------------------
@traced
def scatter_to_sequence_parallel_region(input_, group=None):
    """split the sequence (first) dim forward, all-gather it backward."""
    return _ScatterToSequenceParallelRegion.apply(input_, _tp_group(group))


@traced
def gather_from_sequence_parallel_region(input_, tensor_parallel_output_grad=True, group=None,
                                         output_split_sizes=None):
    """all-gather the sequence dim forward; reduce-scatter (or split) it backward."""
    return _GatherFromSequenceParallelRegion.apply(input_, _tp_group(group), tensor_parallel_output_grad,
                                                   output_split_sizes)


@traced
def reduce_scatter_to_sequence_parallel_region(input_, group=None, input_split_sizes=None):
    """reduce-scatter the sequence dim forward, all-gather it backward."""
    return _ReduceScatterToSequenceParallelRegion.apply(input_, _tp_group(group), input_split_sizes)
