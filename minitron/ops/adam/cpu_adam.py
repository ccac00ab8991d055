"""``deepspeed/ops/adam/cpu_adam.py``: DeepSpeedCPUAdam, the optimizer ZeRO-Offload steps on the
host, with the arithmetic of its C++ kernel (``csrc/adam/cpu_adam_impl.cpp``, ``cpu_adam.h``)
written in torch.

DeepSpeed builds it in place of FusedAdam when ``offload_optimizer`` names a device (the
engine's ``zero_use_cpu_optimizer``): the fp32 master and the moments are host tensors, and a
GPU kernel cannot step them. The update is Adam's, but not FusedAdam's to the bit, because the
kernel computes in float32 throughout, in its own order:

* the bias corrections come from running products kept by the C++ object, one per optimizer:
  ``beta1_t *= beta1`` in float32 each step (not ``beta1 ** step`` in double), then
  ``bc1 = 1 - beta1_t`` and ``bc2 = 1 / sqrt(1 - beta2_t)``, all float32;
* lr, betas, eps and weight decay are float32 (C++ ``float`` arguments), so are the derived
  ``step_size = -lr / bc1`` and ``w_decay = -lr * weight_decay``;
* each element goes through fused multiply-adds (the SIMD path's ``simd_fma``):

      grad     = fma(param, weight_decay, grad)           Adam (adamw_mode off) only
      m        = fma(grad, 1 - beta1, m * beta1)
      v        = fma(grad * grad, 1 - beta2, v * beta2)
      denom    = fma(sqrt(v), bc2, eps)
      param    = fma(param, w_decay, param)               AdamW only
      param    = fma(m / denom, step_size, param)

  except the last ``numel % SIMD_WIDTH`` elements of a tensor (16 floats with AVX-512, 8 with
  AVX2), which its scalar C++ loop steps; GCC contracts that loop's two moment lines the other
  way round, ``m = fma(m, beta1, grad * (1 - beta1))`` and ``v = fma(v, beta2, grad * grad *
  (1 - beta2))``, a last-bit difference that the tests found and this follows.

An fma rounds once; torch has no fused multiply-add on CPU tensors, so ``_fma`` takes the
product in float64 (exact for two float32 values) and the sum there, then rounds to float32;
sqrt and the division go through float64 too (``_exact``).
That rounds twice, and can differ from a true fma in the last bit when the float64 sum lands on
a float32 tie: rare (about one element in 2**29), which is why tests hold this against
DeepSpeed's compiled kernel element by element. What the kernel adds and this does not: SIMD
(AVX-512/AVX2/NEON: 8-16 floats per instruction), OpenMP threads over tiles, and fp16/bf16
parameters converted in registers. The numbers are the same; the speed is not.
"""

from __future__ import annotations

import math
import struct

import torch


# Floats per SIMD instruction in the kernel DeepSpeed would build here (its -march=native build
# takes the widest the CPU has; torch reports the same capability). Without either: all scalar.
SIMD_WIDTH = {"AVX512": 16, "AVX2": 8}.get(torch.backends.cpu.get_cpu_capability(), 1 << 62)


def _f32(x: float) -> float:
    """A Python float rounded to float32, as a C++ ``float`` holds it. One +, -, *, / or sqrt
    done in double and rounded once gives the float32 result exactly (53 >= 2 * 24 + 2 bits)."""
    return struct.unpack("f", struct.pack("f", x))[0]


def _fma(a: torch.Tensor, b, c: torch.Tensor) -> torch.Tensor:
    """a * b + c, rounded to float32 once after the exact product (see the margin above)."""
    b = b.double() if torch.is_tensor(b) else b
    return (a.double() * b + c.double()).float()


def _exact(a: torch.Tensor, op, *others) -> torch.Tensor:
    """sqrt or division, correctly rounded to float32 as the kernel's SIMD instructions are:
    torch's own float32 kernels need not be (its vectorized sqrt is 1 ulp off for some inputs on
    an AVX-512 CPU), float64 then one rounding is."""
    return op(a.double(), *(o.double() for o in others)).float()


class DeepSpeedCPUAdam(torch.optim.Optimizer):
    """Adam (``adamw_mode=False``: weight decay added to the gradient) or AdamW (the default)
    over host tensors, with DeepSpeed's param-group keys and per-parameter state form
    (``step``, ``exp_avg``, ``exp_avg_sq``), as a checkpoint of it holds them."""

    def __init__(self, model_params, lr=1e-3, bias_correction=True, betas=(0.9, 0.999), eps=1e-8, weight_decay=0,
                 amsgrad=False, adamw_mode=True, fp32_optimizer_states=True):
        if amsgrad:
            raise RuntimeError("DeepSpeedCPUAdam does not support the AMSGrad variant.")
        defaults = dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, bias_correction=bias_correction,
                        amsgrad=amsgrad)
        super().__init__(model_params, defaults)
        self.adam_w_mode = adamw_mode
        if not fp32_optimizer_states:   # moments in the parameters' dtype: a different arithmetic
            raise RuntimeError("fp32_optimizer_states=False (moments in bf16/fp16) is not built in minitron")
        # The C++ Adam_Optimizer's own counters: shared by every parameter of this optimizer.
        self._step, self._betas = 0, (_f32(betas[0]), _f32(betas[1]))
        self._beta1_t = self._beta2_t = 1.0

    def _increment_step(self, step: int, beta1: float, beta2: float) -> None:
        """Adam_Optimizer::IncrementStep: multiply the running powers once per new step; a jump
        or new betas recompute them (std::pow in double, kept as float)."""
        if (beta1, beta2) != self._betas:
            self._betas = (beta1, beta2)
            self._step, self._beta1_t, self._beta2_t = step, _f32(beta1 ** step), _f32(beta2 ** step)
        elif step == self._step + 1:
            self._step += 1
            self._beta1_t, self._beta2_t = _f32(self._beta1_t * beta1), _f32(self._beta2_t * beta2)
        elif step != self._step:
            self._step, self._beta1_t, self._beta2_t = step, _f32(beta1 ** step), _f32(beta2 ** step)

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
                if p.device.type != "cpu":   # DeepSpeed's assertion, in its words' sense
                    raise RuntimeError(f"CPUAdam param is on {p.device} and must be 'cpu': enable "
                                       "zero_optimization.offload_optimizer")
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
                    state["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
                state["step"] += 1
                self._update(p, group, state)
        return loss

    def _update(self, p: torch.Tensor, group: dict, state: dict) -> None:
        beta1, beta2 = _f32(group["betas"][0]), _f32(group["betas"][1])
        self._increment_step(state["step"], beta1, beta2)
        lr, eps, decay = _f32(group["lr"]), _f32(group["eps"]), _f32(group["weight_decay"])
        bc1, bc2 = 1.0, 1.0   # Adam_Optimizer::update_state
        if group["bias_correction"]:
            bc1 = _f32(1 - self._beta1_t)
            bc2 = _f32(1 / _f32(math.sqrt(_f32(1 - self._beta2_t))))
        step_size, w_decay = _f32(-lr / bc1), _f32(-lr * decay)
        grad, m, v, param = p.grad.float(), state["exp_avg"], state["exp_avg_sq"], p.data
        if decay > 0 and not self.adam_w_mode:
            grad = _fma(param, decay, grad)
        simd = m.numel() - m.numel() % SIMD_WIDTH   # the vector loop's elements; the rest: the scalar tail
        m_new, v_new = _fma(grad, _f32(1 - beta1), m * beta1), _fma(grad * grad, _f32(1 - beta2), v * beta2)
        m_tail, v_tail = _fma(m, beta1, grad * _f32(1 - beta1)), _fma(v, beta2, grad * grad * _f32(1 - beta2))
        m.view(-1).copy_(torch.cat([m_new.view(-1)[:simd], m_tail.view(-1)[simd:]]))
        v.view(-1).copy_(torch.cat([v_new.view(-1)[:simd], v_tail.view(-1)[simd:]]))
        denom = _fma(_exact(v, torch.sqrt), bc2, torch.full_like(v, eps))
        if decay > 0 and self.adam_w_mode:
            param.copy_(_fma(param, w_decay, param))
        param.copy_(_fma(_exact(m, torch.div, denom), step_size, param))
