"""One contiguous gradient buffer per dtype, cut into buckets; the collectives that reduce them.

Why contiguous: the gradients of a model are hundreds of tensors. Reducing them one by one
costs hundreds of collectives, each paying a fixed latency. With every parameter's gradient
living at an offset in one flat tensor (``param.main_grad`` is a view into it), a whole run of
parameters is reduced by a single call on a slice of that tensor.

Why buckets: one collective over the whole buffer can only start after backward has finished.
Cut into buckets, the collective of a bucket can start as soon as the last gradient in it has
arrived, while backward is still computing the gradients of earlier layers. Parameters are
laid out in *reverse* order, so the buckets fill roughly in the order backward produces them.

With the distributed optimizer each bucket is split into dp equal shards: DP rank r owns shard
r. Reduce-scatter leaves on each rank the summed gradient of its shard only, and after the
optimizer step an all-gather puts the updated shards back together. Shards must be equal, so
buckets are padded to a multiple of dp (Megatron pads to lcm(dp, 128) and starts every
parameter on a 64-element boundary, for aligned GPU memory access; we keep its numbers).
"""

from __future__ import annotations

import math

import torch

from minitron.core.distributed.distributed_data_parallel_config import BUCKET_END_ALIGN, PARAM_START_ALIGN
from minitron.trace import traced


def _pad(number: int, divisor: int) -> int:
    return -(-number // divisor) * divisor


def shard_buffer(buffer: torch.Tensor, data_parallel_world_size: int) -> list[torch.Tensor]:
    """Cut a flat buffer into equal contiguous views; view r is DP rank r's shard."""
    if buffer.numel() % data_parallel_world_size:
        raise ValueError(f"a buffer of {buffer.numel()} elements does not split into "
                         f"{data_parallel_world_size} equal shards: it should have been padded")
    size = buffer.numel() // data_parallel_world_size
    return [buffer[r * size:(r + 1) * size] for r in range(data_parallel_world_size)]


class _ParamAndGradBucket:
    """A run of neighbouring parameters whose gradients one collective reduces."""

    def __init__(self, params, param_data, grad_data, offset: int, numel_unpadded: int,
                 gradient_scaling_factor: float, bucket_id: int):
        self.params_list = params
        self.params = set(params)
        self.param_data = param_data      # view of the param buffer (distributed optimizer only)
        self.grad_data = grad_data        # view of the grad buffer
        self.offset = offset              # where this bucket starts in the whole buffer
        self.numel_unpadded = numel_unpadded
        self.gradient_scaling_factor = gradient_scaling_factor
        self.bucket_id = bucket_id


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


class _ParamAndGradBuffer:
    """The flat gradient (and, for ZeRO-1, parameter) storage of one dtype, and its buckets."""

    def __init__(self, ddp_config, param_dtype: torch.dtype, grad_dtype: torch.dtype, params,
                 data_parallel_group, bucket_size: int | None, param_to_name: dict,
                 gradient_scaling_factor: float):
        if len(set(params)) != len(params):
            raise ValueError("a parameter appears twice in the list given to the grad buffer")
        self.ddp_config = ddp_config
        self.params = list(params)
        self.param_dtype, self.grad_dtype = param_dtype, grad_dtype
        self.data_parallel_group = data_parallel_group
        self.data_parallel_world_size = torch.distributed.get_world_size(group=data_parallel_group)
        self.gradient_scaling_factor = gradient_scaling_factor
        self.param_to_name = param_to_name
        self.param_index_map = {}   # param -> (start, end, bucket_id) in the buffer
        self.bucket_indices = []    # (start, end) of each bucket, padding included
        self._numel_unpadded_per_bucket = []
        self.numel = self._lay_out(bucket_size)
        self.numel_unpadded = sum(self._numel_unpadded_per_bucket)

        device = self.params[0].device
        self.grad_data = torch.zeros(self.numel, dtype=grad_dtype, device=device)
        self.param_data = None
        if ddp_config.use_distributed_optimizer:
            # The parameters move into one flat buffer too, so that the all-gather after the
            # optimizer step writes straight into them. fp8 parameters (--fp8-param-gather) live
            # in a byte buffer, Megatron's uint8: collectives move bytes, they know no fp8 dtype.
            storage = torch.uint8 if param_dtype.itemsize == 1 else param_dtype
            self.param_data = torch.zeros(self.numel, dtype=storage, device=device)
        for param in self.params:
            start, _, _ = self.param_index_map[param]
            if self.param_data is not None:
                old = param.data
                param.data = self._get(old.shape, start, self.param_data).view(old.dtype)
                param.data.copy_(old)
            param.main_grad = self._get(param.data.shape, start, self.grad_data)

        self.buckets = []
        self.param_to_bucket = {}
        for bucket_id, (start, end) in enumerate(self.bucket_indices):
            members = [p for p in reversed(self.params) if self.param_index_map[p][2] == bucket_id]
            bucket = _ParamAndGradBucket(
                members, None if self.param_data is None else self.param_data[start:end],
                self.grad_data[start:end], start, self._numel_unpadded_per_bucket[bucket_id],
                gradient_scaling_factor, bucket_id)
            self.buckets.append(bucket)
            self.param_to_bucket.update({p: bucket for p in members})

    def _lay_out(self, bucket_size: int | None) -> int:
        """Give each parameter its [start, end) and close buckets; return the padded total size."""
        dist_opt = self.ddp_config.use_distributed_optimizer
        bucket_align = math.lcm(self.data_parallel_world_size, BUCKET_END_ALIGN)
        next_free, bucket_start, in_bucket = 0, 0, 0

        def close_bucket(end: int) -> int:
            nonlocal bucket_start, in_bucket
            self._numel_unpadded_per_bucket.append(end - bucket_start)
            padded_end = _pad(end, bucket_align) if dist_opt else end
            self.bucket_indices.append((bucket_start, padded_end))
            bucket_start, in_bucket = padded_end, 0
            return padded_end

        for param in reversed(self.params):   # backward meets the last layers first
            start = _pad(next_free, PARAM_START_ALIGN) if dist_opt else next_free
            # With ZeRO-1 the tied embedding gets a bucket of its own, so the first and last
            # pipeline stages shard it identically and can all-reduce their matching shards.
            alone = dist_opt and getattr(param, "shared_embedding", False)
            if alone and in_bucket:
                start = close_bucket(start)
            end = start + param.data.nelement()
            self.param_index_map[param] = (start, end, len(self.bucket_indices))
            in_bucket += 1
            if alone or (bucket_size is not None and end - bucket_start >= bucket_size):
                next_free = close_bucket(end)
            else:
                next_free = end
        if in_bucket:
            close_bucket(next_free)
        return bucket_start

    def _get(self, shape: torch.Size, start: int, flat: torch.Tensor) -> torch.Tensor:
        return flat[start:start + shape.numel()].view(shape)

    def scale_gradients(self, scaling_factor: float) -> None:
        self.grad_data *= scaling_factor

    def reset(self) -> None:
        """Zero the gradients: backward hooks add into main_grad, they never overwrite it."""
        self.grad_data.zero_()


def partition_buckets(buffers) -> list[_ParamAndGradBucketGroup]:
    """One bucket group per bucket, over the buffer's own data-parallel group."""
    return [_ParamAndGradBucketGroup([bucket], buffer.ddp_config, buffer.data_parallel_group,
                                     buffer.data_parallel_world_size)
            for buffer in buffers for bucket in buffer.buckets]
