"""Tensor parallelism: split layers, the collectives between them, the loss, and the RNG streams.

The names are Megatron's ``megatron.core.tensor_parallel``: code written against Megatron's
``tensor_parallel.ColumnParallelLinear`` reads the same here.
"""

from minitron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy
from minitron.core.tensor_parallel.data import broadcast_data
from minitron.core.tensor_parallel.layers import (
    ColumnParallelLinear, LinearWithGradAccumulationAndAsyncCommunication, RowParallelLinear,
    VocabParallelEmbedding, linear_with_grad_accumulation_and_async_allreduce,
    param_is_not_tensor_parallel_duplicate, set_tensor_model_parallel_attributes,
)
from minitron.core.tensor_parallel.mappings import (
    all_to_all, copy_to_tensor_model_parallel_region, gather_from_sequence_parallel_region,
    gather_from_tensor_model_parallel_region, reduce_from_tensor_model_parallel_region,
    reduce_scatter_to_sequence_parallel_region, scatter_to_sequence_parallel_region,
    scatter_to_tensor_model_parallel_region,
)
from minitron.core.tensor_parallel.random import (
    CudaRNGStatesTracker, checkpoint, get_cuda_rng_tracker, get_data_parallel_rng_tracker_name,
    get_expert_parallel_rng_tracker_name, model_parallel_cuda_manual_seed,
)
from minitron.core.tensor_parallel.utils import VocabUtility, divide

__all__ = [
    "ColumnParallelLinear", "RowParallelLinear", "VocabParallelEmbedding",
    "LinearWithGradAccumulationAndAsyncCommunication", "linear_with_grad_accumulation_and_async_allreduce",
    "param_is_not_tensor_parallel_duplicate", "set_tensor_model_parallel_attributes",
    "copy_to_tensor_model_parallel_region", "reduce_from_tensor_model_parallel_region",
    "scatter_to_tensor_model_parallel_region", "gather_from_tensor_model_parallel_region",
    "scatter_to_sequence_parallel_region", "gather_from_sequence_parallel_region",
    "reduce_scatter_to_sequence_parallel_region", "all_to_all",
    "vocab_parallel_cross_entropy", "broadcast_data",
    "CudaRNGStatesTracker", "checkpoint", "get_cuda_rng_tracker", "model_parallel_cuda_manual_seed",
    "get_data_parallel_rng_tracker_name", "get_expert_parallel_rng_tracker_name",
    "VocabUtility", "divide",
]
