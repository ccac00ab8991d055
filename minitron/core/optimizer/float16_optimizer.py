"""Float16OptimizerWithFloat16Params: the optimizer of an fp16 or bf16 model without ZeRO.

The model keeps its 16-bit parameters (what the forward and backward run in); torch's optimizer
steps fp32 *main* copies that take their places in the param groups, and each step rounds the
main copies back into the model. An update of lr x grad ~ 1e-7 would vanish if added to a 16-bit
weight directly: near 1.0 their spacing is 1e-3 (fp16) or 8e-3 (bf16).

Megatron keeps it in optimizer.py with the base classes; it is a file of its own here so that
optimizer.py reads as the step's shape (MegatronOptimizer), its fp32 form and what the mixed-
precision optimizers share (MixedPrecisionOptimizer: loss scaling, the Inf check), and this file
as the one thing it adds: the main copies. The distributed optimizer (distrib_optimizer.py) keeps
its main copies as shards instead.
"""

from __future__ import annotations

import torch

from minitron.core.optimizer.optimizer import (
    _FLOAT16, MixedPrecisionOptimizer, _zero_grad_group_helper, copy_model_parallel_attributes,
)


class Float16OptimizerWithFloat16Params(MixedPrecisionOptimizer):
    """fp16/bf16 model params, stepped through fp32 main copies that replace them in the groups."""

    def __init__(self, optimizer, config, grad_scaler):
        super().__init__(optimizer, config, grad_scaler)
        self.float16_groups = []            # the model's 16-bit params
        self.fp32_from_float16_groups = []  # their fp32 main copies (what torch steps)
        self.fp32_from_fp32_groups = []     # fp32 model params, stepped directly
        for group in self.optimizer.param_groups:
            float16, main, fp32 = [], [], []
            for i, param in enumerate(group["params"]):
                if param.dtype in _FLOAT16:
                    main_param = param.detach().clone().float()
                    copy_model_parallel_attributes(main_param, param)
                    group["params"][i] = main_param
                    param.main_param = main_param
                    float16.append(param)
                    main.append(main_param)
                elif param.dtype == torch.float32:
                    fp32.append(param)
                else:
                    raise TypeError(f"parameters must be float32, float16 or bfloat16, got {param.dtype}")
            self.float16_groups.append(float16)
            self.fp32_from_float16_groups.append(main)
            self.fp32_from_fp32_groups.append(fp32)

    def _pairs(self):
        for model_group, main_group in zip(self.float16_groups, self.fp32_from_float16_groups):
            yield from zip(model_group, main_group)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for groups in (self.float16_groups, self.fp32_from_float16_groups, self.fp32_from_fp32_groups):
            for group in groups:
                _zero_grad_group_helper(group, set_to_none)

    def _collect_main_grad_data_for_unscaling(self):
        groups = self.fp32_from_float16_groups + self.fp32_from_fp32_groups
        mains = [p for group in groups for p in group]
        return [p.grad for p in mains if p.grad is not None]

    def _copy_model_grads_to_main_grads(self) -> None:
        for model_param, main_param in self._pairs():
            grad = getattr(model_param, "main_grad", model_param.grad)
            if grad is not None:
                main_param.grad = grad.float()
            model_param.grad = None
        for group in self.fp32_from_fp32_groups:
            for model_param in group:
                if hasattr(model_param, "main_grad"):
                    model_param.grad = model_param.main_grad

    def _copy_main_params_to_model_params(self) -> None:
        for model_param, main_param in self._pairs():
            model_param.data.copy_(main_param)     # rounds fp32 -> fp16/bf16

    def _copy_model_params_to_main_params(self) -> None:
        for model_param, main_param in self._pairs():
            main_param.data.copy_(model_param)

    def state_dict(self) -> dict:
        state = {"optimizer": self.optimizer.state_dict(),
                 "fp32_from_fp16_params": self.fp32_from_float16_groups}
        if self.grad_scaler is not None:
            state["grad_scaler"] = self.grad_scaler.state_dict()
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        self.optimizer.load_state_dict(state_dict["optimizer"])
        if self.grad_scaler is not None and "grad_scaler" in state_dict:
            self.grad_scaler.load_state_dict(state_dict["grad_scaler"])
        for current, saved in zip(self.fp32_from_float16_groups, state_dict["fp32_from_fp16_params"]):
            for current_param, saved_param in zip(current, saved):
                current_param.data.copy_(saved_param.data)
