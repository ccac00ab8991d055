"""One contiguous gradient buffer per dtype, cut into buckets: where each parameter's gradient lives.

Why contiguous: the gradients of a model are hundreds of tensors. Reducing them one by one
costs hundreds of collectives, each paying a fixed latency. With every parameter's gradient
living at an offset in one flat tensor (``param.main_grad`` is a view into it), a whole run of
parameters is reduced by a single call on a slice of that tensor.

Why buckets, and in reverse: a bucket's collective can start as soon as its last gradient has
arrived (param_and_grad_buffer.py launches them). Parameters are laid out last layer first, so
the buckets fill roughly in the order backward produces them.

With the distributed optimizer each bucket is split into dp equal shards: DP rank r owns shard
r. Reduce-scatter leaves on each rank the summed gradient of its shard only, and after the
optimizer step an all-gather puts the updated shards back together. Shards must be equal, so
buckets are padded to a multiple of dp (Megatron pads to lcm(dp, 128) and starts every
parameter on a 64-element boundary, for aligned GPU memory access; we keep its numbers).

Megatron keeps this layout in param_and_grad_buffer.py together with the bucket groups that
reduce it; here the layout (no collective, nothing traced) has a file of its own, and
param_and_grad_buffer.py, which keeps the groups under Megatron's qualified names, re-exports it.
"""

from __future__ import annotations

import math

import torch

from minitron.core.distributed.distributed_data_parallel_config import BUCKET_END_ALIGN, PARAM_START_ALIGN


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
