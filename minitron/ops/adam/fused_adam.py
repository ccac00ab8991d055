"""``deepspeed/ops/adam/fused_adam.py``: FusedAdam, DeepSpeed's default Adam, in plain torch.

A ds_config's ``"Adam"`` or ``"AdamW"`` builds this optimizer unless its params say
``"torch_adam": true`` (then torch's own Adam or AdamW: runtime/engine_optimizer.py). DeepSpeed
runs it as one kernel over many tensors (CUDA, or a C++ extension it JIT-builds on its CPU
accelerator); minitron runs the same arithmetic one tensor at a time. What must match exactly
is the *state*, because a checkpoint is that state pickled, and DeepSpeed's engine steps it
straight after loading:

* each param group carries FusedAdam's defaults, ``lr``, ``bias_correction``, ``betas``,
  ``eps``, ``weight_decay``, and, once it has stepped, ``step`` (0: a place-holder older files
  kept the count in; a fresh parameter's count starts from it). DeepSpeed's step reads
  ``group['bias_correction']``, so a torch AdamW group, which has none, fails there with a
  KeyError;
* each parameter's state is ``step`` (a Python int, not torch's tensor), ``exp_avg`` and
  ``exp_avg_sq``;
* ``adam_w_mode`` (decoupled weight decay, AdamW) is an attribute of the optimizer, not of a
  group: it is not in the file, the config decides it again at every start.

One difference in bookkeeping, none in arithmetic: DeepSpeed 0.19.8 adds 1 to the count of the
*last* parameter of a group and uses that count for the whole group (its loop variable
outlives the loop), so the other parameters' counts stay 0. Here each parameter counts its own
steps. The ZeRO optimizers hand each group over as a single flat tensor, where the two are
the same thing, and a group's counts, however stored, are read back as the largest of them
(runtime/checkpoint/adam_state.py).
"""

from __future__ import annotations

import math

import torch


class FusedAdam(torch.optim.Optimizer):
    """Adam (``adam_w_mode=False``: weight decay added to the gradient, an L2 penalty) or AdamW
    (the default: weight decay applied to the weight, apart from the moments)."""

    def __init__(self, params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, adam_w_mode=True,
                 weight_decay=0.0, amsgrad=False, set_grad_none=True):
        if amsgrad:   # as DeepSpeed: its kernel has no max of the second moments
            raise RuntimeError("FusedAdam does not support the AMSGrad variant.")
        # These five and no more are a group's keys: what a checkpoint's param_groups hold.
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay)
        super().__init__(params, defaults)
        self.adam_w_mode = 1 if adam_w_mode else 0
        self.set_grad_none = set_grad_none

    def zero_grad(self, set_to_none: bool | None = None) -> None:
        super().zero_grad(set_to_none=self.set_grad_none if set_to_none is None else set_to_none)

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            group.setdefault("step", 0)
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict) -> None:
        """One Adam step of one tensor, in the order DeepSpeed's kernels compute it."""
        if p.grad.is_sparse:
            raise RuntimeError("FusedAdam does not support sparse gradients, please consider SparseAdam instead")
        state = self.state[p]
        if not state:   # a group-level count from an older file is where a fresh count starts
            state["step"] = group.get("step", 0)
            state["exp_avg"] = torch.zeros_like(p)
            state["exp_avg_sq"] = torch.zeros_like(p)
        state["step"] += 1
        beta1, beta2 = group["betas"]
        lr, eps, decay = group["lr"], group["eps"], group["weight_decay"]
        grad, m, v = p.grad, state["exp_avg"], state["exp_avg_sq"]
        if decay and not self.adam_w_mode:   # Adam's L2 penalty: part of the gradient, so of the moments
            grad = grad.add(p, alpha=decay)
        m.mul_(beta1).add_(grad, alpha=1 - beta1)
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
        # Bias correction undoes the moments' start at zero; without it the first steps are small.
        correct1 = 1 - beta1 ** state["step"] if group["bias_correction"] else 1.0
        correct2 = 1 - beta2 ** state["step"] if group["bias_correction"] else 1.0
        denom = (v.sqrt() / math.sqrt(correct2)).add_(eps)
        if decay and self.adam_w_mode:       # AdamW: the decay shrinks the weight directly, not via the moments
            p.add_(p, alpha=-lr * decay)
        p.addcdiv_(m, denom, value=-lr / correct1)
