"""``deepspeed/ops/lion/``: Lion (Chen et al. 2023, "Symbolic Discovery of Optimization
Algorithms"), the optimizer a ds_config's ``"Lion"`` (any case) builds, in plain torch.

DeepSpeed has two: FusedLion, a CUDA kernel (``csrc/lion/multi_tensor_lion.cu``), and
DeepSpeedCPULion (``csrc/lion/cpu_lion_impl.cpp``), which the engine builds instead when
``offload_optimizer`` keeps the states on the host. Both compute, per element, in float32:

    c = beta1 m + (1 - beta1) g          the direction: a blend of momentum and gradient...
    w = w (1 - lr wd) - lr sign(c)       ...of which only the sign is kept: every element moves by lr
    m = beta2 m + (1 - beta2) g          the momentum is updated after, with its own beta

One state per element (Adam keeps two), no epsilon, no bias correction. The sign is taken as the
C++ kernel takes it, ``copysign(lr, c)``: a zero ``c`` moves the weight by -lr, where
``torch.sign`` would leave it. On a gloo rank DeepSpeed cannot build FusedLion (its kernel is
CUDA-only), so minitron's FusedLion is this same arithmetic on whatever device the weights are.
"""

from __future__ import annotations

import torch


class DeepSpeedCPULion(torch.optim.Optimizer):
    def __init__(self, model_params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, fp32_optimizer_states=True):
        # DeepSpeed's group keys, these three: a checkpoint's param_groups hold exactly them.
        super().__init__(model_params, dict(lr=lr, betas=betas, weight_decay=weight_decay))
        # fp32_optimizer_states false keeps the momentum in the weight's own dtype (bf16/fp16 weights)
        self.fp32_optimizer_states = fp32_optimizer_states

    # DeepSpeedCPULion allocates Adam's second moment too and never reads it: a zero tensor per
    # weight in its state (and checkpoint), host memory Lion's one-state design was meant to save.
    # minitron keeps it, so that a checkpoint has DeepSpeed's keys and its bytes are what DeepSpeed holds.
    keeps_unused_variance = True

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            lr, decay = group["lr"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    # DeepSpeed's state keys: a step count and the one moment, named as Adam's first
                    dtype = torch.float if self.fp32_optimizer_states else p.dtype
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=dtype)
                    if self.keeps_unused_variance:
                        state["exp_avg_sq"] = torch.zeros_like(p, dtype=dtype)
                state["step"] += 1
                m, g, w = state["exp_avg"], p.grad.float(), p.float()
                c = m * beta1 + g * (1 - beta1)
                update = -torch.copysign(torch.full_like(c, lr), c)
                # the kernel multiplies by (1 - lr wd) only when wd > 0: at 0 the weight is untouched
                w = w * (1 - lr * decay) + update if decay > 0 else w + update
                m.copy_(m * beta2 + g * (1 - beta2))
                p.copy_(w)
        return loss


class FusedLion(DeepSpeedCPULion):
    """FusedLion's arguments (set_grad_none is zero_grad's business here) and the same step."""

    keeps_unused_variance = False   # the CUDA kernel's state is the step and the momentum only

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), weight_decay=0.0, set_grad_none=True):
        super().__init__(params, lr=lr, betas=betas, weight_decay=weight_decay)
