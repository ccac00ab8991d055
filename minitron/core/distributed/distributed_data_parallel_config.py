"""DistributedDataParallelConfig: the switches of the data-parallel gradient machinery.

Megatron keeps these apart from the TransformerConfig because they describe how gradients
travel between replicas, not what the model is. Field names are Megatron's.
"""

from __future__ import annotations

from dataclasses import dataclass

# How the distributed optimizer pads the gradient buffer (param_and_grad_buffer_layout.py), in elements:
# every parameter starts on a multiple of 64 (128 bytes of a 16-bit type) and every bucket ends
# on a multiple of lcm(dp, 128), so that it splits into dp equal shards that start aligned.
# Kept here, torch-free, because the memory estimator lays out the same buffer without torch.
PARAM_START_ALIGN = 64
BUCKET_END_ALIGN = 128


@dataclass
class DistributedDataParallelConfig:
    # Keep the gradient buffer (and do the reduction) in fp32 even when the model is bf16/fp16.
    # Summing many small half-precision numbers loses bits; Megatron's flag for it is
    # --accumulate-allreduce-grads-in-fp32.
    grad_reduce_in_fp32: bool = False

    # Launch each bucket's collective as soon as its last gradient arrives in backward, instead
    # of one collective after backward is over. Without it the buffer is a single bucket.
    overlap_grad_reduce: bool = False

    # ZeRO-1: reduce-scatter gradients (each DP rank keeps the sum of its slice only) and let the
    # DistributedOptimizer step that slice; parameters are all-gathered after the step.
    use_distributed_optimizer: bool = False

    # ZeRO-1 with overlap_grad_reduce: all-gather each bucket's updated parameters during the
    # next forward pass (launched bucket by bucket, waited for in forward pre-hooks) instead of
    # at the end of optimizer.step().
    overlap_param_gather: bool = False

    # Elements per bucket. None: Megatron's default, max(40M, 1M x dp) when overlapping,
    # else one bucket for the whole buffer (see resolve_bucket_size).
    bucket_size: int | None = None

    # Average with the collective itself (ReduceOp.AVG) instead of pre-scaling by 1/dp and
    # summing. Same numbers up to rounding; NCCL can fuse the division.
    average_in_collective: bool = False

    # Before each collective, stop with a clear error if a bucket holds NaN or Inf.
    check_for_nan_in_grad: bool = False

    def __post_init__(self):
        if self.bucket_size is not None and self.bucket_size < 1:
            raise ValueError(f"DistributedDataParallelConfig.bucket_size must be a positive number "
                             f"of elements or None, got {self.bucket_size}")
        if self.overlap_param_gather and not (self.use_distributed_optimizer and self.overlap_grad_reduce):
            raise ValueError("overlap_param_gather needs use_distributed_optimizer and overlap_grad_reduce "
                             "(Megatron's rule: only sharded parameters are gathered, bucket by bucket)")


def resolve_bucket_size(bucket_size: int | None, overlap_grad_reduce: bool, dp_size: int,
                        disable_bucketing: bool = False) -> int | None:
    """Elements per bucket for one model chunk; None means one bucket for the whole buffer.

    Buckets only pay off when their collectives overlap backward. Megatron's default is large
    (a bucket must be big enough for the collective to run at full bandwidth, and bigger still
    at large dp, where each rank's piece of it shrinks). It also turns bucketing off
    (``disable_bucketing``) for every chunk but the first of an interleaved pipeline and on
    pipeline stages after the first: those reductions are not on the critical path (the first
    stage's first chunk finishes backward last). Torch-free: the estimator lays out the same
    buffer."""
    if not overlap_grad_reduce or disable_bucketing:
        return None
    return bucket_size if bucket_size is not None else max(40_000_000, 1_000_000 * dp_size)
