"""1-bit Adam: DeepSpeed's ``OnebitAdam`` (``runtime/fp16/onebit/adam.py``) as DeepSpeed 0.19.6 has
it, the last release that does (0.19.7 removed the 1-bit optimizers; 0.19.8, minitron's reference
elsewhere, refuses ``"OneBitAdam"``). Paper: arXiv 2102.02888.

Adam's two moments behave differently over training: the variance v (the mean of g²) settles
early and then barely moves, while the momentum m follows the gradient. 1-bit Adam runs in
three stages, by ``step()`` call:

    call 1            an initialisation step: the error buffers are made and one compressed
                      exchange of the (zero) momentum runs; no moment or weight changes, and this
                      first gradient is dropped
    calls 2..freeze_step
                      warm-up: Adam on the gradient the engine all-reduced in fp32:
                      m = b1 m + (1-b1) g, v = b2 v + (1-b2) g², w -= lr (m / (sqrt(v) + eps) + wd w),
                      with no bias correction (DeepSpeed's code takes bias_correction and eps_inside_sqrt
                      and uses neither)
    after call freeze_step
                      v is frozen. The engine stops all-reducing gradients; each rank folds its own
                      gradient into its own m, and the ranks average m through the compressed
                      all-reduce (runtime/comm/compressed.py): one sign bit per element and a scale
                      per chunk, with error feedback. The update uses the averaged m and frozen v.

Freezing v first is what makes compressing m safe: with v fixed, m / sqrt(v) is a linear
function of m, so the error fed back into the next exchange adds up to exactly what was lost.
A v still moving (as g² of a compressed m would make it) would scale each step's error
differently and the feedback would no longer cancel it.

Per tensor: DeepSpeed compresses each tensor it is handed, padded so every rank's chunk holds whole
bytes. In fp32 it hands the module's tensors; in fp16 FP16_Optimizer's one flat fp32 copy per group.
minitron's stage 0 keeps one flat master per group in both cases, so the engine says where each
tensor lies in it (``tensor_sizes``; in fp16 one size, the group's) and each part is compressed
as DeepSpeed would compress that tensor.
"""

from __future__ import annotations

import math

import torch

from minitron import comm as dist
from minitron.runtime.comm.compressed import CompressedBackend


class OnebitAdam(torch.optim.Optimizer):

    def __init__(self, params, deepspeed=None, lr=1e-3, freeze_step=100000, bias_correction=True, betas=(0.9, 0.999),
                 eps=1e-8, eps_inside_sqrt=False, weight_decay=0., max_grad_norm=0., amsgrad=False, cuda_aware=False,
                 comm_backend_name="nccl"):
        if amsgrad:   # as DeepSpeed: there is no maximum of v to keep once v is frozen
            raise RuntimeError("1-bit Adam does not support the AMSGrad variant.")
        defaults = dict(lr=lr, bias_correction=bias_correction, betas=betas, eps=eps, weight_decay=weight_decay,
                        max_grad_norm=max_grad_norm)
        super().__init__(params, defaults)
        self.deepspeed = deepspeed          # the engine: told to stop all-reducing at the freeze
        self.adam_freeze_key = False        # True: the compressed stage (and during call 1)
        self.initialize = False             # True after call 1
        self.freeze_step = freeze_step
        self.cuda_aware = cuda_aware        # read by DeepSpeed's MPI backend only
        group = deepspeed.data_parallel_group if deepspeed is not None else None
        self.comm_backend_handle = CompressedBackend(group, comm_backend_name)
        self.size = self.comm_backend_handle.size
        # every rank's chunk must be whole bytes: tensors are padded to a multiple of size x lcm(size, 8)
        self.divider = self.size * 8 // math.gcd(self.size, 8)
        self.tensor_sizes: dict = {}        # master -> the tensors' sizes laid end to end in it (engine)

    def _segments(self, p: torch.Tensor) -> list:
        """(offset, numel) of each tensor DeepSpeed would hand this optimizer, inside ``p``."""
        sizes, out, offset = self.tensor_sizes.get(p, [p.numel()]), [], 0
        for n in sizes:
            out.append((offset, n))
            offset += n
        return out

    def _make_errors(self, p: torch.Tensor, state: dict) -> None:
        unit = self.size * self.divider
        padded = [n + (-n) % unit for _, n in self._segments(p)]
        state["worker_error"] = [torch.zeros(n, device=p.device) for n in padded]
        state["server_error"] = [torch.zeros(n // self.size, device=p.device) for n in padded]

    @torch.no_grad()
    def step(self, closure=None):
        loss = closure() if closure is not None else None
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.is_sparse:
                    raise RuntimeError("1-bit Adam does not support sparse gradients")
                grad, state = p.grad, self.state[p]
                if len(state) == 0:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                if not self.initialize or (self.adam_freeze_key and "worker_error" not in state):
                    self._make_errors(p, state)
                    self.adam_freeze_key = True
                exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
                state["step"] += 1
                if not self.adam_freeze_key:
                    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                else:
                    if self.initialize:   # this rank's own gradient: the engine no longer reduces it
                        exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
                    if self.size > 1:
                        for (offset, n), worker, server in zip(self._segments(p), state["worker_error"],
                                                               state["server_error"]):
                            part = exp_avg.view(-1).narrow(0, offset, n)
                            part.copy_(self.comm_backend_handle.compressed_allreduce(part, worker, server))
                if self.initialize:
                    update = exp_avg / (exp_avg_sq.sqrt() + group["eps"])
                    if group["weight_decay"] > 0.0:
                        update += group["weight_decay"] * p
                    p.add_(-group["lr"] * update)
                if not self.initialize:
                    # (DeepSpeed pops the last tensor's only; the others' are zeros and stay
                    # zeros until the freeze, so dropping them all changes no number)
                    state.pop("worker_error")
                    state.pop("server_error")
        if not self.initialize:
            self.adam_freeze_key, self.initialize = False, True
            return loss
        if not self.adam_freeze_key and self._steps() >= self.freeze_step:
            self.adam_freeze_key = True
            if self.deepspeed is not None:
                self.deepspeed.enable_backward_allreduce = False
        return loss

    def _steps(self) -> int:
        """The step count (every tensor's is the same: each takes part in every call)."""
        for state in self.state.values():
            return state["step"]
        return 0

    def load_state_dict(self, state_dict):
        """DeepSpeed's rules on loading: the stage follows the loaded step count, and both error
        buffers start again from zero (each rank's are its own, and a checkpoint holds one rank's)."""
        super().load_state_dict(state_dict)
        frozen = self._steps() >= self.freeze_step
        self.adam_freeze_key = frozen
        if self.deepspeed is not None:
            self.deepspeed.enable_backward_allreduce = not frozen
        for state in self.state.values():
            state.pop("worker_error", None)
            state.pop("server_error", None)
