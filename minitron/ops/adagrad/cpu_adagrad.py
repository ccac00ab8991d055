"""``deepspeed/ops/adagrad/cpu_adagrad.py``: DeepSpeedCPUAdagrad, with the arithmetic of its C++
kernel (``csrc/adagrad/cpu_adagrad.cpp``) in plain torch.

DeepSpeed's engine builds it for ``"Adagrad"`` when ``offload_optimizer`` keeps the states on the
host, and torch.optim.Adagrad otherwise. Per element, in float32:

    g  = g + wd w            (only when wd > 0: L2 weight decay, into the gradient)
    s  = s + g^2             the running sum of squares, never decayed...
    w  = w - lr g / (sqrt(s) + eps)     ...so each element's step shrinks as its gradients add up

which is torch's Adagrad at lr_decay 0 and initial_accumulator_value 0 (the kernel has neither).
``amsgrad`` is taken and ignored, as DeepSpeed's constructor takes and ignores it.
"""

from __future__ import annotations

import torch


class DeepSpeedCPUAdagrad(torch.optim.Optimizer):
    def __init__(self, model_params, lr=1e-2, eps=1e-10, weight_decay=0, amsgrad=False, fp32_optimizer_states=True):
        super().__init__(model_params, dict(lr=lr, eps=eps, weight_decay=weight_decay, amsgrad=amsgrad))
        self.fp32_optimizer_states = fp32_optimizer_states

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:   # DeepSpeed's keys: a step count and the sum, named as Adam's second moment
                    state["step"] = 0
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float if self.fp32_optimizer_states
                                                           else p.dtype)
                state["step"] += 1
                g, w, s = p.grad.float(), p.float(), state["exp_avg_sq"]
                if group["weight_decay"] > 0:
                    g = g + w * group["weight_decay"]
                s.add_(g * g)
                p.copy_(w - group["lr"] * (g / (s.sqrt() + group["eps"])))
        return loss
