"""DistributedDataParallelConfig: the switches of the data-parallel gradient machinery.

Megatron keeps these apart from the TransformerConfig because they describe how gradients
travel between replicas, not what the model is. Field names are Megatron's.
"""

from __future__ import annotations

from dataclasses import dataclass

# How the distributed optimizer pads the gradient buffer (param_and_grad_buffer.py), in elements:
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

    # Elements per bucket. None: Megatron's default, max(40M, 1M x dp) when overlapping,
    # else one bucket for the whole buffer.
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
