"""The flat buffers of ZeRO stages 0-2 and their partitions, built per param group as DeepSpeed's
``DeepSpeedZeroOptimizer.__init__`` builds them (the margin of ``stage_1_and_2.py`` draws them).

Three things are decided here, once, and every step leans on them:

* the order: the group's parameters end to end, or dealt round robin to the ranks' partitions
  (``round_robin_gradients``);
* the padding: the buffer's length a multiple of 2 × dp (``NCCL_START_ALIGNMENT_FACTOR``), so it
  cuts into dp equal partitions;
* which elements the gradient norm counts: under tensor parallelism a slice counts on every
  rank and a copy on tensor rank 0 only (``norm_mask``).
"""

from __future__ import annotations

import torch

from minitron import comm as dist   # as DeepSpeed's ZeRO: from deepspeed import comm as dist
from minitron.runtime.zero.alignment import NCCL_START_ALIGNMENT_FACTOR


def flatten_dense_tensors_aligned(tensors: list, alignment: int) -> torch.Tensor:
    """The tensors end to end, zero-padded so the length is a multiple of ``alignment``, on
    their device (the engine has moved the module there already)."""
    numel = sum(t.numel() for t in tensors)
    flat = torch.zeros(-(-numel // alignment) * alignment, dtype=tensors[0].dtype, device=tensors[0].device)
    offset = 0
    for t in tensors:
        flat[offset:offset + t.numel()].copy_(t.detach().reshape(-1))
        offset += t.numel()
    return flat


def round_robin_order(params: list, dp: int) -> list:
    """DeepSpeed's round_robin_gradients: parameter k is dealt to pile k % dp and the piles are laid
    end to end, so each rank's partition holds a more even share of the parameters (and of the
    gradients reduced onto it in backward) than consecutive layers would give it. The flat
    buffer, its partitions and a checkpoint's param_shapes all follow this order, as in DeepSpeed."""
    return [p for pile in range(dp) for p in params[pile::dp]]


class FlatPartitionLayout:
    """DeepSpeedZeroOptimizer's layout (stage 3 inherits the norm's counting for its pieces)."""

    def _init_model_parallel(self, model_parallel_group, model_parallel_rank: int | None = None) -> None:
        """With tensor parallelism, each rank's gradient is a slice of some parameters and a
        copy of the others; the norm counts a slice on every rank, a copy on tensor rank 0 only,
        and sums over the tensor-parallel group too (DeepSpeed's get_grad_norm_direct). Under
        a PipelineEngine that group spans the pipeline's stages as well, so the tensor rank
        comes separately (``model_parallel_rank``), and a tied weight's second copy (marked
        ``ds_pipe_replicated`` by the PipelineModule) is not counted again."""
        self.model_parallel_group = model_parallel_group
        if model_parallel_rank is None:
            model_parallel_rank = dist.get_rank(group=model_parallel_group) if model_parallel_group else 0
        self.model_parallel_rank = model_parallel_rank
        self.norm_mask = []   # per group, over my partition: 1.0 where an element counts

    def _counted(self, p: torch.Tensor) -> torch.Tensor:
        counts = (getattr(p, "tensor_model_parallel", False) or self.model_parallel_rank == 0) and not getattr(
            p, "ds_pipe_replicated", False)
        return torch.tensor([1.0 if counts else 0.0], dtype=torch.float64, device=p.device)

    def _partition_group(self, group: dict, round_robin_gradients: bool) -> None:
        """One param group laid out: its flat buffer (the parameters become views into it), the
        buffer's dp partitions, my partition's fp32 master (on the host when offloaded), and my
        partition's norm mask. The torch optimizer is left holding the master only."""
        params = [p for p in group["params"] if p.requires_grad]
        if round_robin_gradients and self.stage >= 1:
            params = round_robin_order(params, self.dp_world_size)
        self.bit16_groups.append(params)
        flat = flatten_dense_tensors_aligned(params, NCCL_START_ALIGNMENT_FACTOR * self.dp_world_size)
        self.bit16_groups_flat.append(flat)
        offset = 0
        for p in params:   # the model's parameters now live inside the flat buffer
            p.data = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        size = flat.numel() // self.partition_count
        partitions = [flat.narrow(0, k * size, size) for k in range(self.partition_count)]
        self.parallel_partitioned_bit16_groups.append(partitions)
        master = partitions[self.partition_id].detach().clone().float()
        master = (self.offload.host_tensor(master) if self.offload.optimizer else master).requires_grad_(True)
        self.single_partition_of_fp32_groups.append(master)
        group["params"] = [master]   # from here on the torch optimizer sees my partition only
        counted = torch.cat([self._counted(p).expand(p.numel()) for p in params]
                            + [torch.zeros(flat.numel() - offset, dtype=torch.float64, device=flat.device)])
        self.norm_mask.append(counted.narrow(0, self.partition_id * size, size))
