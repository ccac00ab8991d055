"""``deepspeed/ops/lamb/fused_lamb.py``: FusedLamb, what a ds_config's ``"Lamb"`` builds, in plain torch.

DeepSpeed runs LAMB as a CUDA kernel only (``csrc/lamb/fused_lamb_cuda_kernel.cu``; its op
builder loads nowhere else). Its arithmetic, per tensor, as that kernel computes it in fp32:

    m  = beta1 m + (1 - beta1) g                       the moments, *not* bias-corrected...
    v  = beta2 v + (1 - beta2) g^2
    u  = m / (sqrt(v) + eps) + weight_decay * w        (eps_inside_sqrt: m / sqrt(v + eps))
    coeff = ||w|| / ||u||, clipped into [min_coeff, max_coeff]; 1 when either norm is 0
    w -= step_size * coeff * u,  step_size = lr sqrt(1 - beta2^t) / (1 - beta1^t)
                                                       ...the correction is folded into the step

So the trust ratio is measured on the uncorrected update, and weight decay is part of the update
(decoupled from the moments, as in AdamW) before the ratio is taken. ``max_coeff`` caps how far a
layer with small updates may be pushed; ``min_coeff`` keeps a layer with large ones moving.

"Per tensor" means per tensor the optimizer is given. At stage 0 DeepSpeed hands it the module's
own tensors (or, in 16 bits, FP16_UnfusedOptimizer's fp32 copy of each); minitron's stage 0 keeps
one flat fp32 master per group instead (runtime/zero/stage_1_and_2.py), so the engine tells this
optimizer where each tensor lies in it (``tensor_sizes``) and a ratio is taken per tensor there too.
Under ZeRO 1-3 DeepSpeed hands it each rank's flat partition, and the ratio is one per partition:
the same here, since the partitions are the same.
"""

from __future__ import annotations

import math

import torch


class FusedLamb(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, eps_inside_sqrt=False,
                 weight_decay=0.0, max_grad_norm=0.0, max_coeff=10.0, min_coeff=0.01, amsgrad=False):
        if amsgrad:   # as DeepSpeed's: the kernel keeps no maximum of the second moments
            raise RuntimeError("FusedLamb does not support the AMSGrad variant.")
        # DeepSpeed's group keys, all eight: a checkpoint's param_groups hold exactly these.
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm, max_coeff=max_coeff, min_coeff=min_coeff)
        super().__init__(params, defaults)
        self.eps_mode = 0 if eps_inside_sqrt else 1    # the kernel's mode 0: eps inside the root
        self.lamb_coeffs: list = []                    # this step's ratios, one per tensor, as DeepSpeed keeps them
        # param -> the sizes of the tensors laid end to end in it (a stage-0 flat master); not state:
        # the engine says it again at every start.
        self.tensor_sizes: dict = {}

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        self.lamb_coeffs.clear()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("FusedLamb does not support sparse gradients")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                self._update(p, state, group)
        return loss

    def _update(self, p: torch.Tensor, state: dict, group: dict) -> None:
        beta1, beta2 = group["betas"]
        m, v, g = state["exp_avg"], state["exp_avg_sq"], p.grad.float()
        m.mul_(beta1).add_(g, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
        denom = (v + group["eps"]).sqrt() if self.eps_mode == 0 else v.sqrt().add_(group["eps"])
        update = (m / denom).add_(p, alpha=group["weight_decay"])
        t = state["step"]
        step_size = group["lr"]
        if group["bias_correction"]:
            step_size = group["lr"] * math.sqrt(1 - beta2 ** t) / (1 - beta1 ** t)
        flat_p, flat_u = p.view(-1), update.view(-1)
        offset = 0
        # A flat master's alignment padding, past its last tensor, is left alone: its weights,
        # gradients and so its update are all zero.
        for size in self.tensor_sizes.get(p, [p.numel()]):
            w, u = flat_p.narrow(0, offset, size), flat_u.narrow(0, offset, size)
            coeff = self._trust_ratio(w, u, group)
            w.add_(u, alpha=-step_size * coeff)
            self.lamb_coeffs.append(torch.tensor(coeff))  # host: a float already, read back by get_lamb_coeffs
            offset += size

    @staticmethod
    def _trust_ratio(w: torch.Tensor, u: torch.Tensor, group: dict) -> float:
        w_norm, u_norm = w.float().norm().item(), u.float().norm().item()
        if w_norm == 0 or u_norm == 0:   # a zero weight (a fresh bias) or no update: the plain step
            return 1.0
        # The kernel's order: first the cap, then the floor (so min_coeff wins if they cross).
        return max(min(w_norm / u_norm, group["max_coeff"]), group["min_coeff"])

    def get_lamb_coeffs(self) -> list:
        return [c.item() for c in self.lamb_coeffs]
