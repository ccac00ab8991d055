"""The collectives that reduce a gradient buffer's buckets (the buffer itself, and how its
buckets and shards are laid out: param_and_grad_buffer_layout.py).

Why buckets: one collective over the whole buffer can only start after backward has finished.
Cut into buckets, the collective of a bucket can start as soon as the last gradient in it has
arrived, while backward is still computing the gradients of earlier layers. A bucket group
counts the arrivals, launches the reduction (all-reduce, or reduce-scatter with the
distributed optimizer), and with the distributed optimizer all-gathers the updated shards
back before the forward pass needs them.

The groups stay in the module Megatron keeps them in, so their traced calls carry Megatron's
qualified names (``param_and_grad_buffer._ParamAndGradBucketGroup.start_grad_sync``).
"""

from __future__ import annotations

import torch

# _ParamAndGradBuffer is re-exported: DDP builds its buffers from here, as from Megatron's module.
from minitron.core.distributed.param_and_grad_buffer_layout import _ParamAndGradBuffer, shard_buffer  # noqa: F401
from minitron.trace import traced


class _ParamAndGradBucketGroup:
    """Launches the collective(s) of its buckets, once every gradient in them is ready.

    Megatron groups several buckets to coalesce their kernels (fp8 + bf16 buffers); minitron
    puts one bucket in each group, Megatron's choice when there is no fp8.
    """

    def __init__(self, buckets, ddp_config, collective_group, collective_group_size: int):
        self.buckets = buckets
        self.ddp_config = ddp_config
        self.data_parallel_group = collective_group
        self.data_parallel_world_size = collective_group_size
        self.data_parallel_rank = torch.distributed.get_rank(group=collective_group)
        self.params = set().union(*(bucket.params for bucket in buckets))
        # Overlap: a bucket is ready when every parameter has reported as often as it did in
        # the first iteration (Megatron's "golden" counts). The first iteration only counts:
        # its buckets are launched by finish_grad_sync, after backward, so a bucket holding a
        # parameter that backward never reaches cannot hang the step that first meets it.
        self.golden_per_param_grad_ready_counts: dict = {}
        self.per_param_grad_ready_counts: dict = {}
        self.is_first_batch = True
        self.grad_reduce_handle = None     # the in-flight reduction (overlap_grad_reduce)
        self.grad_reduce_finished = False
        self.param_gather_handle = None    # the in-flight all-gather (overlap_param_gather)
        self.param_gather_dispatched = False
        # The bucket whose parameters the forward pass needs after mine (set by DDP).
        self.next_param_gather_bucket_group = None
        self.is_last_microbatch = True

    def reset(self) -> None:
        """Forget which gradients arrived: called by zero_grad_buffer before each step."""
        if self.is_first_batch and self.per_param_grad_ready_counts:
            if len(self.per_param_grad_ready_counts) != len(self.params):
                raise RuntimeError(
                    f"overlap_grad_reduce: {len(self.params) - len(self.per_param_grad_ready_counts)} of "
                    f"the {len(self.params)} parameters of a gradient bucket got no gradient in the first "
                    "iteration, so the bucket could never be launched from backward; freeze them "
                    "(requires_grad=False) or turn overlap_grad_reduce off")
            self.golden_per_param_grad_ready_counts = self.per_param_grad_ready_counts
            self.is_first_batch = False
        self.per_param_grad_ready_counts = {}
        self.is_last_microbatch = True
        self.grad_reduce_finished = False

    def register_grad_ready(self, param) -> None:
        """Called by the backward hook (overlap mode): launch the collective on the last arrival.

        Inside no_sync (all micro-batches but the last) nothing is counted: the gradients only
        accumulate locally, and the bucket is reduced once, after the last micro-batch.
        """
        if not self.is_last_microbatch:
            return
        self.per_param_grad_ready_counts[param] = self.per_param_grad_ready_counts.get(param, 0) + 1
        if not self.is_first_batch and self.per_param_grad_ready_counts == self.golden_per_param_grad_ready_counts:
            self.start_grad_sync()

    def _check_grads(self) -> None:
        for bucket in self.buckets:
            if not torch.isfinite(bucket.grad_data.norm()):
                raise RuntimeError(f"rank {torch.distributed.get_rank()}: NaN or Inf in gradient bucket "
                                   f"{bucket.bucket_id} before the data-parallel reduction")

    # --8<-- [start:grad-sync]
    @traced(args=lambda self: {"bucket": self.buckets[0].bucket_id,
                               "numel": sum(b.grad_data.numel() for b in self.buckets),
                               "dtype": str(self.buckets[0].grad_data.dtype).replace("torch.", ""),
                               "async": self.ddp_config.overlap_grad_reduce})
    def start_grad_sync(self) -> None:
        """Average this group's gradients over the DP ranks: all-reduce, or reduce-scatter.

        With overlap_grad_reduce the collective is only launched (async_op=True) and this
        returns at once; finish_grad_sync waits for it."""
        if self.grad_reduce_handle is not None:
            raise RuntimeError("the gradient reduction of this bucket is already in flight")
        if self.ddp_config.check_for_nan_in_grad:
            self._check_grads()
        # Either pre-scale by 1/dp and sum, or let the collective average (ReduceOp.AVG).
        for bucket in self.buckets:
            if bucket.gradient_scaling_factor != 1.0:
                bucket.grad_data *= bucket.gradient_scaling_factor
        op = torch.distributed.ReduceOp.AVG if self.ddp_config.average_in_collective else torch.distributed.ReduceOp.SUM
        async_op = self.ddp_config.overlap_grad_reduce
        handles = []
        for bucket in self.buckets:
            if self.ddp_config.use_distributed_optimizer:
                # In place: my shard of grad_data receives the sum of everyone's copy of it;
                # the rest of my grad_data is left stale and is never read.
                mine = shard_buffer(bucket.grad_data, self.data_parallel_world_size)[self.data_parallel_rank]
                handles.append(torch.distributed.reduce_scatter_tensor(
                    mine, bucket.grad_data, op=op, group=self.data_parallel_group, async_op=async_op))
            else:
                handles.append(torch.distributed.all_reduce(
                    bucket.grad_data, op=op, group=self.data_parallel_group, async_op=async_op))
        if async_op:
            self.grad_reduce_handle = handles

    @traced(args=lambda self: {"bucket": self.buckets[0].bucket_id,
                               "in_flight": self.grad_reduce_handle is not None})
    def finish_grad_sync(self) -> None:
        """Synchronous mode: do the reduction now. Overlap mode: wait for the one in flight
        (in the first iteration, launch it first: see __init__)."""
        self.param_gather_dispatched = False   # new gradients: the next forward gathers anew
        if not self.ddp_config.overlap_grad_reduce:
            self.start_grad_sync()
            return
        if self.grad_reduce_finished:
            return
        if self.is_first_batch:
            self.start_grad_sync()
        if self.grad_reduce_handle is None:
            raise RuntimeError(
                f"a gradient bucket was never reduced: {len(self.per_param_grad_ready_counts)} of its "
                f"{len(self.params)} parameters reported a gradient in the last micro-batch. A parameter "
                "unused in backward never fires its hook; turn overlap_grad_reduce off or freeze it")
        for handle in self.grad_reduce_handle:
            handle.wait()
        self.grad_reduce_handle = None
        self.grad_reduce_finished = True
    # --8<-- [end:grad-sync]

    # --8<-- [start:param-sync]
    @traced(args=lambda self, force_sync=False: {
        "bucket": self.buckets[0].bucket_id, "numel": sum(b.param_data.numel() for b in self.buckets),
        "async": self.ddp_config.overlap_param_gather and not force_sync})
    def start_param_sync(self, force_sync: bool = False) -> None:
        """Distributed optimizer: every rank contributes its updated shard, all get all shards.

        With overlap_param_gather the all-gather is only launched; the forward pre-hook of the
        first module that needs these parameters waits for it (finish_param_sync)."""
        if force_sync and self.param_gather_handle is not None:
            self._wait_param_gather()   # already launched: finishing it is what was asked
            return
        if self.param_gather_handle is not None:
            raise RuntimeError("the parameter all-gather of this bucket is already in flight")
        async_op = self.ddp_config.overlap_param_gather and not force_sync
        handles = []
        for bucket in self.buckets:
            mine = shard_buffer(bucket.param_data, self.data_parallel_world_size)[self.data_parallel_rank]
            handles.append(torch.distributed.all_gather_into_tensor(
                bucket.param_data, mine, group=self.data_parallel_group, async_op=async_op))
        if async_op:
            self.param_gather_handle = handles
        self.param_gather_dispatched = True

    @traced(args=lambda self: {"bucket": self.buckets[0].bucket_id})
    def _wait_param_gather(self) -> None:
        """The wait, traced: its record is where the forward pass stood when it needed the bucket."""
        for handle in self.param_gather_handle:
            handle.wait()
        self.param_gather_handle = None

    def finish_param_sync(self) -> None:
        """Forward pre-hook (overlap_param_gather): make this bucket's parameters current, and
        launch the next bucket's all-gather so that it travels while this bucket's layers compute."""
        if not self.param_gather_dispatched:
            self.start_param_sync()   # the first bucket the forward pass meets: nothing ran ahead
        if self.param_gather_handle is None:
            return   # gathered and waited for already, earlier in this forward
        self._wait_param_gather()
        following = self.next_param_gather_bucket_group
        if following is not None and not following.param_gather_dispatched:
            following.start_param_sync()
    # --8<-- [end:param-sync]


def partition_buckets(buffers) -> list[_ParamAndGradBucketGroup]:
    """One bucket group per bucket, over the buffer's own data-parallel group."""
    return [_ParamAndGradBucketGroup([bucket], buffer.ddp_config, buffer.data_parallel_group,
                                     buffer.data_parallel_world_size)
            for buffer in buffers for bucket in buffer.buckets]
