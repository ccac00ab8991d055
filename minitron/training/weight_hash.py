"""Megatron's --check-weight-hash-across-dp-replicas-interval N: every N iterations each rank hashes
its parameters, and the data-parallel replicas of each (the expert-data-parallel ones for an
expert's) compare the hashes. Replicas start equal and apply the same reduced gradient, so they
stay bit-identical; a difference means a rank's memory or a transfer went wrong, and the run
stops with the parameter and the ranks named, before it saves a corrupted checkpoint."""

from __future__ import annotations

import hashlib

import torch

from minitron.core import parallel_state as mpu


def _digest(param: torch.Tensor) -> str:
    data = param.detach().reshape(-1).contiguous().cpu()
    return hashlib.sha256(data.view(torch.uint8).numpy().tobytes()).hexdigest()


def check_param_hashes_across_dp_replicas(model, iteration: int) -> None:
    """Collective over the data-parallel groups: every rank calls it at the same iteration."""
    dense, experts = {}, {}
    for i, chunk in enumerate(model):
        for name, param in chunk.named_parameters():
            # Expert weights are replicated over the expert-data-parallel group only (minitron
            # marks them allreduce=False, as Megatron does).
            (dense if getattr(param, "allreduce", True) else experts)[f"{i}.{name}"] = _digest(param)
    for hashes, group in ((dense, mpu.get_data_parallel_group(with_context_parallel=True)),
                          (experts, mpu.get_expert_data_parallel_group())):
        size = torch.distributed.get_world_size(group)
        if size == 1:
            continue
        everyone = [None] * size
        torch.distributed.all_gather_object(everyone, hashes, group=group)
        ranks = torch.distributed.get_process_group_ranks(group)
        for name, mine in hashes.items():
            differ = [rank for rank, theirs in zip(ranks, everyone) if theirs.get(name) != mine]
            if differ:
                raise RuntimeError(f"--check-weight-hash-across-dp-replicas-interval: at iteration {iteration} "
                                   f"{name} on rank {torch.distributed.get_rank()} differs from its replica on "
                                   f"rank(s) {differ}")
