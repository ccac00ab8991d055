"""The optimizer wrappers: what Megatron adds around torch's Adam and SGD.

``step()`` has the same shape for every precision (MegatronOptimizer.step):

    prepare_grads()           gradients -> where the optimizer reads them; unscale; find Inf
    (skip everything if Inf)  every model-parallel rank agrees to skip, or none does
    clip_grad_norm()          one global norm over all ranks that hold pieces of the model
    step_with_ready_grads()   torch's step on the main params; copy them back to the model

and returns ``(update_successful, grad_norm, num_zeros_in_grad)``.

* FP32Optimizer: the model's own fp32 parameters are stepped; ``main_grad`` becomes ``.grad``.
* MixedPrecisionOptimizer: what the fp16/bf16 optimizers share (loss scaling, the Inf check);
  float16_optimizer.py's Float16OptimizerWithFloat16Params steps fp32 *main* copies of a 16-bit
  model's parameters, distrib_optimizer.py's DistributedOptimizer fp32 main shards.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state
from minitron.core.optimizer.clip_grads import (
    clip_grad_by_total_norm_fp32, count_zeros_fp32, get_grad_norm_fp32, param_is_not_shared,
    reduction_device,
)
from minitron.core.tensor_parallel import param_is_not_tensor_parallel_duplicate
from minitron.trace import traced

_FLOAT16 = (torch.float16, torch.bfloat16)
_MODEL_PARALLEL_ATTRIBUTES = ("tensor_model_parallel", "partition_dim", "partition_stride", "shared",
                              "allreduce")   # allreduce=False: an MoE expert's parameter


def copy_model_parallel_attributes(destination: torch.Tensor, source: torch.Tensor) -> None:
    """A main param must answer "am I a TP slice? a shared copy?" as its model param does."""
    for name in _MODEL_PARALLEL_ATTRIBUTES:
        if hasattr(source, name):
            setattr(destination, name, getattr(source, name))


def _zero_grad_group_helper(group, set_to_none: bool) -> None:
    for param in group:
        if param.grad is not None:
            if set_to_none:
                param.grad = None
            else:
                param.grad.detach_().zero_()


class MegatronOptimizer(ABC):
    """Wraps a torch optimizer; ``config`` is an OptimizerConfig."""

    def __init__(self, optimizer: torch.optim.Optimizer, config):
        self.optimizer = optimizer
        self.config = config
        # The loss scale of an optimizer without a scaler: made once, on the device the loss
        # is on, so scale_loss neither allocates nor copies per micro-batch (Megatron's _scale).
        self._scale_one = torch.ones(1, device=get_accelerator().current_device_name())

    def get_parameters(self) -> list[torch.Tensor]:
        """What the torch optimizer steps: model params (fp32) or main params (fp16/bf16)."""
        return [p for group in self.optimizer.param_groups for p in group["params"]]

    def get_main_grads_for_grad_norm(self) -> list[torch.Tensor]:
        """Gradients to count in the norm: skip shared copies and TP-replicated duplicates."""
        return [p.grad for p in self.get_parameters()
                if p.grad is not None and param_is_not_shared(p) and param_is_not_tensor_parallel_duplicate(p)]

    def get_grad_stats_parallel_group(self):
        """Ranks whose gradients together make one model: the model-parallel (tp x pp) group."""
        return parallel_state.get_model_parallel_group()

    def get_expert_grad_stats_parallel_group(self):
        """MoE experts are split over expert tp x ep x pp, not tp x pp: that group, when it differs."""
        if parallel_state.get_global_ranks("tp-ep-pp") == parallel_state.get_global_ranks("tp-pp"):
            return None
        return parallel_state.get_group("tp-ep-pp")

    def get_grad_norm(self) -> float:
        expert_group = self.get_expert_grad_stats_parallel_group()
        if expert_group is None:
            return get_grad_norm_fp32(self.get_main_grads_for_grad_norm(),
                                      grad_stats_parallel_group=self.get_grad_stats_parallel_group())
        # Dense and expert gradients are summed over different groups; the squares add up.
        counted = [p for p in self.get_parameters() if p.grad is not None and param_is_not_shared(p)
                   and param_is_not_tensor_parallel_duplicate(p)]
        dense = get_grad_norm_fp32([p.grad for p in counted if getattr(p, "allreduce", True)],
                                   grad_stats_parallel_group=self.get_grad_stats_parallel_group())
        expert = get_grad_norm_fp32([p.grad for p in counted if not getattr(p, "allreduce", True)],
                                    grad_stats_parallel_group=expert_group)
        return (dense ** 2 + expert ** 2) ** 0.5

    def clip_grad_norm(self, clip_grad: float) -> float:
        grad_norm = self.get_grad_norm()
        clip_grad_by_total_norm_fp32(self.get_parameters(), clip_grad, grad_norm)
        return grad_norm

    def count_zeros(self) -> float:
        expert_group = self.get_expert_grad_stats_parallel_group()
        if expert_group is None:
            return count_zeros_fp32(self.get_parameters(), self.get_grad_stats_parallel_group())
        params = self.get_parameters()
        return (count_zeros_fp32([p for p in params if getattr(p, "allreduce", True)],
                                 self.get_grad_stats_parallel_group())
                + count_zeros_fp32([p for p in params if not getattr(p, "allreduce", True)], expert_group))

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """The schedules' ``config.grad_scale_func``: multiply the loss before backward."""
        return self.get_loss_scale() * loss

    # The torch optimizer's param_groups and state, reachable through the wrapper (the
    # scheduler writes 'lr' and 'weight_decay' into the groups).
    @property
    def param_groups(self):
        return self.optimizer.param_groups

    @property
    def state(self):
        return self.optimizer.state

    @abstractmethod
    def zero_grad(self, set_to_none: bool = True) -> None: ...

    @abstractmethod
    def get_loss_scale(self) -> torch.Tensor: ...

    @abstractmethod
    def prepare_grads(self) -> bool:
        """Put the gradients where the optimizer reads them; return True if Inf/NaN was found."""

    @abstractmethod
    def step_with_ready_grads(self) -> bool: ...

    @abstractmethod
    def reload_model_params(self) -> None:
        """The model's weights changed outside the optimizer (checkpoint): refresh main params."""

    @abstractmethod
    def state_dict(self) -> dict: ...

    @abstractmethod
    def load_state_dict(self, state_dict: dict) -> None: ...

    @torch.no_grad()
    @traced(args=lambda self: {"optimizer": type(self).__name__})
    def step(self):
        """One update. Returns (update_successful, grad_norm, num_zeros_in_grad)."""
        found_inf = self.prepare_grads()
        if found_inf:
            return False, None, None   # skipped: params untouched, the scaler already backed off
        grad_norm = self.clip_grad_norm(self.config.clip_grad) if self.config.clip_grad > 0.0 else None
        num_zeros_in_grad = self.count_zeros() if self.config.log_num_zeros_in_grad else None
        update_successful = self.step_with_ready_grads()
        return update_successful, grad_norm, num_zeros_in_grad


class FP32Optimizer(MegatronOptimizer):
    """fp32 model: no main copies, no loss scale; DDP's main_grad is handed over as .grad."""

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.optimizer.param_groups:
            _zero_grad_group_helper(group["params"], set_to_none)

    def get_loss_scale(self) -> torch.Tensor:
        return self._scale_one

    def prepare_grads(self) -> bool:
        for param in self.get_parameters():
            if hasattr(param, "main_grad"):
                param.grad = param.main_grad
        return False

    def step_with_ready_grads(self) -> bool:
        self.optimizer.step()
        return True

    def reload_model_params(self) -> None:
        pass   # the optimizer steps the model's own tensors: nothing to refresh

    def state_dict(self) -> dict:
        return self.optimizer.state_dict()

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict)


class MixedPrecisionOptimizer(MegatronOptimizer):
    """What the fp16/bf16 optimizer and the distributed optimizer share: scaling and main params.

    ``grad_scaler`` may be None only for bf16 (its 8 exponent bits cover fp32's range).
    """

    def __init__(self, optimizer, config, grad_scaler):
        super().__init__(optimizer, config)
        if grad_scaler is None and config.fp16:
            raise ValueError("an fp16 optimizer needs a grad scaler (set loss_scale, or leave it None "
                             "for dynamic scaling through get_megatron_optimizer)")
        self.grad_scaler = grad_scaler

    def get_loss_scale(self) -> torch.Tensor:
        return self.grad_scaler.scale if self.grad_scaler is not None else self._scale_one

    def _unscale_main_grads_and_check_for_nan(self) -> bool:
        main_grads = self._collect_main_grad_data_for_unscaling()
        device = reduction_device(main_grads)
        found_inf = torch.zeros(1, dtype=torch.float32, device=device)
        if main_grads:
            # One fused pass: grads *= 1/S, and found_inf = 1 if any entry is Inf or NaN.
            torch._amp_foreach_non_finite_check_and_unscale_(
                main_grads, found_inf, self.grad_scaler.inv_scale.to(device))
        # Every rank holding a piece of the model must take the same decision: one rank
        # skipping while its tensor-parallel partner steps would tear the model apart.
        torch.distributed.all_reduce(found_inf, op=torch.distributed.ReduceOp.MAX,
                                     group=self.get_grad_stats_parallel_group())
        expert_group = self.get_expert_grad_stats_parallel_group()
        if expert_group is not None:   # MoE: and over the expert layout, which then reaches every rank
            torch.distributed.all_reduce(found_inf, op=torch.distributed.ReduceOp.MAX, group=expert_group)
        return found_inf.item() > 0

    @torch.no_grad()
    def prepare_grads(self) -> bool:
        self._copy_model_grads_to_main_grads()
        if self.grad_scaler is None:
            return False
        found_inf = self._unscale_main_grads_and_check_for_nan()
        self.grad_scaler.update(found_inf)
        return found_inf

    @torch.no_grad()
    def step_with_ready_grads(self) -> bool:
        self.optimizer.step()
        self._copy_main_params_to_model_params()
        return True

    def reload_model_params(self) -> None:
        self._copy_model_params_to_main_params()

    @abstractmethod
    def _collect_main_grad_data_for_unscaling(self) -> list[torch.Tensor]: ...

    @abstractmethod
    def _copy_model_grads_to_main_grads(self) -> None: ...

    @abstractmethod
    def _copy_main_params_to_model_params(self) -> None: ...

    @abstractmethod
    def _copy_model_params_to_main_params(self) -> None: ...
