"""The communication inside a tensor-parallel model: autograd functions, in conjugate pairs.

A tensor-parallel layer keeps only a slice of its weights, so at the edges of a "parallel
region" the ranks of a tensor-parallel group must talk. Each crossing is an autograd.Function
whose forward does one collective and whose backward does the *conjugate* one, because the
gradient of a communication step is the communication that undoes its data flow:

    forward                         backward                 used by
    identity (copy)            <->  all-reduce               ColumnParallelLinear input  ("f")*
    all-reduce                 <->  identity                 RowParallelLinear output    ("g")
    split last dim             <->  all-gather last dim      RowParallelLinear, input not parallel
    all-gather last dim        <->  split last dim           ColumnParallelLinear, gather_output
    all-gather last dim        <->  reduce-scatter last dim  attention, fewer kv heads than tp
    split first dim (seq)      <->  all-gather first dim     embedding output, sequence parallel
    all-gather first dim (seq) <->  reduce-scatter first dim a column-parallel input, seq. par.*
    reduce-scatter first dim   <->  all-gather first dim     RowParallelLinear output, seq. par.
    all-to-all                 <->  the reverse all-to-all   MoE's token dispatcher (expert parallel)

* With tp > 1, ColumnParallelLinear does these two inside its own autograd function instead
  (layers.py: LinearWithGradAccumulationAndAsyncCommunication), so that it can overlap them
  with its weight gradient and, with sequence parallelism, keep only its rows of the input.

The first five and the all-to-all live here; the three that cut the first dimension, with
their uneven variants, live in sequence_mappings.py (a file of its own to keep each readable in
one sitting) and are re-exported here under Megatron's names.

Every collective goes through the module attribute (``torch.distributed.all_reduce(...)``), on
the tensor-model-parallel group from parallel_state, so the tracer records it with the group's
name. The public wrappers are ``@traced``, and so is each backward: a gradient collective then
shows up in the trace under the mapping that issued it.

With one rank in the group every collective is skipped: the same model code runs serially.
"""

from __future__ import annotations

import torch

from minitron.core.tensor_parallel.sequence_mappings import (  # noqa: F401  (re-exported: Megatron's names)
    _gather_along_first_dim, _grad_args, _reduce_scatter_along_first_dim, _tp_group, gather_from_sequence_parallel_region,
    reduce_scatter_to_sequence_parallel_region, scatter_to_sequence_parallel_region,
)
from minitron.core.tensor_parallel.utils import split_tensor_along_last_dim
from minitron.trace import traced


# --- the raw collectives (no autograd) ------------------------------------------------------
def _reduce(input_: torch.Tensor, group) -> torch.Tensor:
    """Sum ``input_`` over the group; every rank gets the total."""
    if group.size() == 1:
        return input_
    # Megatron reduces in place, knowing its callers own the tensor. We reduce a private copy:
    # a public function must not change a tensor the caller may still be using.
    output = input_.clone(memory_format=torch.contiguous_format)
    torch.distributed.all_reduce(output, group=group)
    return output


def _split_along_last_dim(input_: torch.Tensor, group) -> torch.Tensor:
    """Keep this rank's slice of the last dimension (no communication)."""
    if group.size() == 1:
        return input_
    return split_tensor_along_last_dim(input_, group.size())[group.rank()].contiguous()


def _gather_along_last_dim(input_: torch.Tensor, group) -> torch.Tensor:
    """Concatenate along the last dimension.

    A collective writes each rank's block one after another in memory, which is a concatenation
    along the *first* dimension. So we gather along dim 0 and then move the blocks to the end.
    """
    world_size = group.size()
    if world_size == 1:
        return input_
    stacked = _gather_along_first_dim(input_, group)
    return torch.cat(stacked.chunk(world_size, dim=0), dim=-1).contiguous()


def _reduce_scatter_along_last_dim(input_: torch.Tensor, group) -> torch.Tensor:
    """Sum over the group and keep this rank's slice of the last dimension of the sum: the
    last-dimension blocks are moved to the front, where the collective cuts."""
    world_size = group.size()
    if world_size == 1:
        return input_
    return _reduce_scatter_along_first_dim(torch.cat(input_.chunk(world_size, dim=-1), dim=0), group)


# --- the autograd functions ---------------------------------------------------------------
class _CopyToModelParallelRegion(torch.autograd.Function):
    """f: forward passes the replicated input through; backward sums the gradients.

    Every rank feeds the same X into its own column slice of a weight. Each slice's output
    depends on X, so dL/dX is the sum of the contributions from all ranks: an all-reduce.
    """

    @staticmethod
    def forward(ctx, input_, group):
        ctx.group = group
        return input_

    @staticmethod
    @traced(args=_grad_args)
    def backward(ctx, grad_output):
        return _reduce(grad_output, ctx.group), None


class _ReduceFromModelParallelRegion(torch.autograd.Function):
    """g: forward sums the partial outputs; backward passes the gradient through.

    Y = Y_1 + ... + Y_p, so dL/dY_i = dL/dY: each rank already holds the whole gradient.
    """

    @staticmethod
    def forward(ctx, input_, group):
        return _reduce(input_, group)

    @staticmethod
    @traced(args=_grad_args)
    def backward(ctx, grad_output):
        return grad_output, None


class _ScatterToModelParallelRegion(torch.autograd.Function):
    """Keep my slice of the last dimension; backward gathers the slices' gradients back."""

    @staticmethod
    def forward(ctx, input_, group):
        ctx.group = group
        return _split_along_last_dim(input_, group)

    @staticmethod
    @traced(args=_grad_args)
    def backward(ctx, grad_output):
        return _gather_along_last_dim(grad_output, ctx.group), None


class _GatherFromModelParallelRegion(torch.autograd.Function):
    """Concatenate the slices along the last dimension; backward keeps my slice of the gradient."""

    @staticmethod
    def forward(ctx, input_, group):
        ctx.group = group
        return _gather_along_last_dim(input_, group)

    @staticmethod
    @traced(args=_grad_args)
    def backward(ctx, grad_output):
        return _split_along_last_dim(grad_output, ctx.group), None


class _AllGatherFromTensorParallelRegion(_GatherFromModelParallelRegion):
    """The same gather forward; backward *sums* the gradients over the group before keeping my
    slice: unlike gather_output's, every rank here goes on to use parts of the whole
    (attention with fewer key/value heads than ranks), so each slice's gradient has a share
    from every rank."""

    @staticmethod
    @traced(args=_grad_args)
    def backward(ctx, grad_output):
        return _reduce_scatter_along_last_dim(grad_output, ctx.group), None


class _AllToAll(torch.autograd.Function):
    """Rank r sends input rows [sum(input_split_sizes[:j]), +input_split_sizes[j]) to rank j and
    receives output_split_sizes[j] rows from it (None: equal blocks). Backward sends the
    gradients back the way they came: the same call with the two size lists swapped."""

    @staticmethod
    def forward(ctx, group, input, output_split_sizes, input_split_sizes):
        ctx.group, ctx.output_split_sizes, ctx.input_split_sizes = group, output_split_sizes, input_split_sizes
        if group.size() == 1:
            return input
        rows = input.size(0) if output_split_sizes is None else sum(output_split_sizes)
        output = input.new_empty((rows,) + tuple(input.shape[1:]))
        torch.distributed.all_to_all_single(output, input.contiguous(), output_split_sizes=output_split_sizes,
                                            input_split_sizes=input_split_sizes, group=group)
        return output

    @staticmethod
    @traced(args=_grad_args)
    def backward(ctx, grad_output):
        return None, _AllToAll.apply(ctx.group, grad_output, ctx.input_split_sizes, ctx.output_split_sizes), None, None


# --- the public names the layers call -----------------------------------------------------
@traced
def copy_to_tensor_model_parallel_region(input_, group=None):
    """f: identity forward, all-reduce backward."""
    return _CopyToModelParallelRegion.apply(input_, _tp_group(group))


@traced
def reduce_from_tensor_model_parallel_region(input_, group=None):
    """g: all-reduce forward, identity backward."""
    return _ReduceFromModelParallelRegion.apply(input_, _tp_group(group))


@traced
def scatter_to_tensor_model_parallel_region(input_, group=None):
    """split the last dim forward, all-gather it backward."""
    return _ScatterToModelParallelRegion.apply(input_, _tp_group(group))


@traced
def gather_from_tensor_model_parallel_region(input_, group=None):
    """all-gather the last dim forward, split it backward."""
    return _GatherFromModelParallelRegion.apply(input_, _tp_group(group))


@traced
def all_gather_last_dim_from_tensor_parallel_region(input_, group=None):
    """all-gather the last dim forward, reduce-scatter it backward."""
    return _AllGatherFromTensorParallelRegion.apply(input_, _tp_group(group))


@traced
def all_to_all(group, input_, output_split_sizes_=None, input_split_sizes=None):
    """all-to-all forward (uneven blocks allowed), the reverse all-to-all backward. The trailing
    underscore of ``output_split_sizes_`` is Megatron's spelling."""
    return _AllToAll.apply(group, input_, output_split_sizes_, input_split_sizes)
