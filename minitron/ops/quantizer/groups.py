"""How ZeRO++ cuts a tensor into quantization blocks: facts both the quantizer and the estimator
(training/theoretical_zeropp.py) need, so this module imports no torch."""

from __future__ import annotations

import math

TARGET_GROUP_SIZE = 8000   # CUDAQuantizer.target_group_size: "the optimal size is 4k"


def weight_groups(numel: int) -> int:
    """How many blocks CUDAQuantizer.quantize cuts ``numel`` weights into (qwZ): the fewest that
    keep a block under ~8000 elements, raised until 8 × groups divides ``numel``, then doubled
    while that still divides and the blocks stay over 8000. ValueError where no count fits, with
    the reason DeepSpeed asserts."""
    groups = math.ceil(numel / TARGET_GROUP_SIZE)
    while groups < numel:
        if numel % (8 * groups) == 0:
            break
        groups += 1
    while numel % (8 * groups * 2) == 0 and numel / groups > TARGET_GROUP_SIZE:
        groups *= 2
    if numel % (8 * groups) != 0:
        raise ValueError(f"quantized weights need the number of weights to be a multiple of 8; {numel} is not")
    if not numel > groups:
        raise ValueError(f"no block size fits {numel} weights")
    return groups


def gradient_groups(shape: tuple, world: int) -> int:
    """qgZ's blocks for a gradient of ``shape`` (all_to_all_quant_reduce's intra_quant_group):
    the larger of its first two sizes and the world, so a matrix's block is about a row or a
    column of it."""
    return max(shape[0], shape[1], world)


def qgz_applies(shape: tuple, world: int) -> bool:
    """Whether DeepSpeed's qgZ takes a gradient of ``shape``, rather than its reduce-scatter
    fallback: 2-D and up, and a size that 2 × dp divides (each rank's int4 bytes split evenly);
    minitron also asks that the dp partitions hold whole blocks, which the kernel assumes."""
    numel = math.prod(shape)
    return len(shape) > 1 and numel % (2 * world) == 0 and gradient_groups(shape, world) % world == 0
