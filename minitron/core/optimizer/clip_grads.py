"""The global gradient norm of a model cut across many ranks, clipping by it, counting zeros.

The norm that clipping needs is the norm of the *whole* model's gradient, as if it lived on
one device. Each rank sums the squares of the gradient entries it is responsible for, and an
all-reduce adds the sums. "Responsible" is the delicate part, because some values exist on
several ranks:

* a tensor-parallel *slice* (``tensor_model_parallel=True``) is a distinct piece on every TP
  rank: each rank counts its own;
* a *replicated* parameter (layernorm, row-parallel bias: no such attribute) is the same on
  every TP rank: only TP rank 0 counts it;
* the last pipeline stage's copy of the tied embedding (``shared=True``) repeats the first
  stage's: only the first stage counts it.

Data-parallel replicas hold identical (already averaged) gradients, so the sum runs over the
model-parallel group only, unless the distributed optimizer split them (then the whole world).
Under torch's FSDP2 each gradient is a DTensor of this rank's rows: its local rows are counted
and the sum runs over its data-parallel group first (the group the DTensor is cut over).
"""

from __future__ import annotations

import math

import torch

from minitron.accelerator import get_accelerator
from minitron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from minitron.core.utils import get_data_parallel_group_if_dtensor, to_local_if_dtensor
from minitron.trace import traced


def reduction_device(tensors) -> torch.device:
    """Where a statistic's all-reduce buffer must live: with the tensors, or (a rank holding
    none) on the rank's device, the one its backend reduces (NCCL: only GPU memory)."""
    for tensor in tensors:
        if tensor is not None:
            return tensor.device
    return torch.device(get_accelerator().current_device_name())


def param_is_not_shared(param: torch.Tensor) -> bool:
    """False for the duplicate copy of a tied weight (Megatron's transformer/module.py helper)."""
    return not getattr(param, "shared", False)


@traced(args=lambda grads_for_norm, norm_type=2, grad_stats_parallel_group=None:
        {"tensors": len(grads_for_norm), "norm_type": float(norm_type)})
def get_grad_norm_fp32(grads_for_norm, norm_type: float = 2,
                       grad_stats_parallel_group=None) -> float:
    """The p-norm of the gradients of every rank in ``grad_stats_parallel_group``, in fp32."""
    if isinstance(grads_for_norm, torch.Tensor):
        grads_for_norm = [grads_for_norm]
    data_parallel_group = None   # FSDP2's: its gradients are DTensors cut over it
    for grad in grads_for_norm:
        data_parallel_group = get_data_parallel_group_if_dtensor(grad, data_parallel_group)
    grads_for_norm = [to_local_if_dtensor(grad) for grad in grads_for_norm]
    norm_type = float(norm_type)
    device = reduction_device(grads_for_norm)
    if norm_type == math.inf:
        # The max over ranks of the max on each rank (an empty shard adds nothing).
        total = torch.zeros(1, dtype=torch.float32, device=device)
        for grad in grads_for_norm:
            if grad.numel():
                total = torch.maximum(total, grad.detach().abs().max().float())
        if data_parallel_group is not None:
            torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.MAX, group=data_parallel_group)
        torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.MAX, group=grad_stats_parallel_group)
        return total.item()
    # Sum of |g|^p over my share, summed over ranks, then the p-th root.
    total = torch.zeros(1, dtype=torch.float32, device=device)
    for grad in grads_for_norm:
        total += torch.linalg.vector_norm(grad.detach().float(), norm_type) ** norm_type
    if data_parallel_group is not None:
        torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM, group=data_parallel_group)
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM, group=grad_stats_parallel_group)
    return total.item() ** (1.0 / norm_type)


def clip_grad_by_total_norm_fp32(parameters, max_norm: float, total_norm: float) -> None:
    """Scale every gradient by max_norm / total_norm if that is below 1 (in place)."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        for param in parameters:
            if param.grad is not None:
                param.grad.detach().mul_(clip_coeff)


def count_zeros_fp32(parameters, grad_stats_parallel_group) -> float:
    """How many gradient entries are exactly zero, model-wide, each value counted once."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    device = reduction_device([to_local_if_dtensor(p.grad) for p in parameters if p.grad is not None])
    total = torch.zeros(1, dtype=torch.float32, device=device)
    data_parallel_group = None   # FSDP2's, as in get_grad_norm_fp32
    for param in parameters:
        if param.grad is not None and param_is_not_shared(param) and param_is_not_tensor_parallel_duplicate(param):
            data_parallel_group = get_data_parallel_group_if_dtensor(param.grad, data_parallel_group)
            grad = to_local_if_dtensor(param.grad)
            total += grad.numel() - torch.count_nonzero(grad)
    if data_parallel_group is not None:
        torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM, group=data_parallel_group)
    torch.distributed.all_reduce(total, op=torch.distributed.ReduceOp.SUM, group=grad_stats_parallel_group)
    return total.item()
