"""Where a layer's weights are allocated, and where their numbers are drawn.

Megatron has two ways to fill a tensor-parallel weight (both in its tensor_parallel/layers.py):

* ``_initialize_affine_weight_cpu`` (``--use-cpu-initialization``): every rank draws the *full*
  master weight on the CPU, from the same generator, and keeps its slice. No rank sends weights
  to another, and the slices of a tp run put together are the serial run's weight, bit for bit.
* ``_initialize_affine_weight_gpu`` (Megatron's default): each rank allocates only its slice on
  its GPU and draws it there, on the model-parallel RNG stream (tensor_parallel/random.py), so
  the slices of one matrix are independent draws. No full matrix on any rank and no copy from
  the host, but the numbers depend on tp.

minitron's rule (``initialize_affine_weight``): a rank computing on the CPU always takes the
first way, as if the flag were given (it is the only way Megatron runs without a GPU, and it
keeps every layout equal to the serial model: the test suite rests on that); a GPU rank does
what Megatron does, by the flag.

Either way the parameter itself is allocated on the rank's device (``init_device``). Megatron
leaves ``--use-cpu-initialization`` weights on the CPU until get_model moves the model; placing
each slice at once reaches the same end without a host copy of the whole model.
"""

from __future__ import annotations

from typing import Callable

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state
from minitron.core.init_rng import building_on_meta
from minitron.core.tensor_parallel.random import _MODEL_PARALLEL_RNG_TRACKER_NAME, get_cuda_rng_tracker
from minitron.core.tensor_parallel.utils import divide


def init_device() -> torch.device:
    """The device this rank's parameters and buffers are made on: the one it computes on, or
    meta while --init-model-with-meta-device builds shapes only (core/init_rng.build_on_meta)."""
    if building_on_meta():
        return torch.device("meta")
    return torch.device(get_accelerator().current_device_name())


def set_tensor_model_parallel_attributes(tensor: torch.Tensor, is_parallel: bool, dim: int,
                                         stride: int = 1) -> None:
    """Label a parameter with how it is split, for checkpointing and gradient clipping later."""
    tensor.tensor_model_parallel = is_parallel
    tensor.partition_dim = dim
    tensor.partition_stride = stride


def _initialize_affine_weight_cpu(weight: torch.Tensor, output_size: int, input_size: int,
                                  per_partition_size: int, partition_dim: int,
                                  init_method: Callable, stride: int = 1, *,
                                  rank: int | None = None, world_size: int | None = None) -> torch.Tensor:
    """Draw the full [output_size, input_size] weight, then copy this rank's slice into ``weight``.

    Every rank draws the same full matrix (same seed, same generator, same order of draws),
    so no rank needs to send weights to another, and the result does not depend on tp.
    ``stride`` > 1 deals the slices out round-robin (for fused weights laid out in blocks).
    ``rank``/``world_size``: the group that splits it, the tensor-parallel one unless given
    (an expert's weight is split by the expert-tensor-parallel group).
    """
    set_tensor_model_parallel_attributes(weight, True, partition_dim, stride)
    master_weight = torch.empty(output_size, input_size, dtype=torch.float32)  # host: the flag's point
    init_method(master_weight)
    master_weight = master_weight.to(dtype=weight.dtype)
    pieces = torch.split(master_weight, divide(per_partition_size, stride), dim=partition_dim)
    rank = parallel_state.get_tensor_model_parallel_rank() if rank is None else rank
    world_size = parallel_state.get_tensor_model_parallel_world_size() if world_size is None else world_size
    with torch.no_grad():
        weight.copy_(torch.cat(pieces[rank::world_size], dim=partition_dim))   # to weight's device
    return master_weight


def _initialize_affine_weight_gpu(weight: torch.Tensor, init_method: Callable, partition_dim: int,
                                  stride: int = 1, rng_tracker_name: str | None = None) -> None:
    """Draw this rank's slice in place, on its device, on the model-parallel stream (or the one
    named: the expert-parallel stream for experts), so the ranks' slices are independent."""
    set_tensor_model_parallel_attributes(weight, True, partition_dim, stride)
    with get_cuda_rng_tracker().fork(rng_tracker_name or _MODEL_PARALLEL_RNG_TRACKER_NAME), torch.no_grad():
        init_method(weight)


def initialize_affine_weight(weight: torch.Tensor, config, output_size: int, input_size: int,
                             per_partition_size: int, partition_dim: int, init_method: Callable,
                             stride: int = 1, *, rank: int | None = None, world_size: int | None = None,
                             rng_tracker_name: str | None = None) -> None:
    """Fill the slice ``weight`` of an [output_size, input_size] matrix split along
    ``partition_dim``, by the rule in the module docstring; label it either way."""
    if not config.perform_initialization or weight.is_meta:   # a checkpoint will overwrite it / a shape only
        set_tensor_model_parallel_attributes(weight, True, partition_dim, stride)
    elif config.use_cpu_initialization or weight.device.type == "cpu":
        _initialize_affine_weight_cpu(weight, output_size, input_size, per_partition_size, partition_dim,
                                      init_method, stride, rank=rank, world_size=world_size)
    else:
        _initialize_affine_weight_gpu(weight, init_method, partition_dim, stride, rng_tracker_name)
