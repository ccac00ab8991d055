"""``deepspeed/profiling/flops_profiler/profiler.py``: a per-module profile of one forward pass.

DeepSpeed counts operations by formula, not by measuring: while profiling, it swaps torch's
functions (``F.linear``, ``torch.matmul``, ``F.softmax``, ...) for wrappers that add the call's
FLOPs and MACs (multiply-accumulates) to the module running it, then calls the original. Each
module keeps only its *own* calls' counts (a stack of lists, pushed by a forward pre-hook and
summed into the module by its forward hook), and a module's total is its own plus its
submodules'. Latency is wall time between the two hooks. The formulas are DeepSpeed's:

    F.linear               MACs = input elements x out_features      FLOPs = 2 MACs (no bias term)
    matmul, mm, bmm        MACs = prod(a.shape) x b.shape[-1]        FLOPs = 2 MACs
    addmm, baddbmm         as mm, plus one FLOP per element of the added input
    scaled_dot_product_attention   QK^T and scores V over the full s x s scores: 2 MACs each
    relu, gelu, silu, softmax      one FLOP per element;  layer_norm: 5 per element (4 unscaled)
    add, mul (torch. and Tensor. methods, not the + and * operators)   one per output element
    embedding, dropout     nothing

So a forward's MACs are its matrix products. Megatron's model-FLOP count (training/theoretical_flops.py)
is 2 x 3 x those (a multiply-add is 2 FLOPs; backward costs twice forward) less the causal half of
the s x s attention scores, which it does not count; tests/test_ds_flops_profiler.py holds the two
to that identity. einsum, convolutions, pooling and the other norms are left uncounted here.
"""

from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F

from minitron.accelerator import get_accelerator
from minitron.runtime.profiling import report

_stack: list = []        # one [flops, macs] per module whose forward is running


def _prod(shape) -> int:
    return math.prod(shape)


def _elements(a, b=None) -> int:
    if not torch.is_tensor(a):
        return _prod(b.shape) if torch.is_tensor(b) else 1
    return _prod(a.shape) if not torch.is_tensor(b) else _prod(torch.broadcast_shapes(a.shape, b.shape))


def _mm(a, b, *args, **kwargs):
    macs = _prod(a.shape) * b.shape[-1]
    return 2 * macs, macs


def _addmm(c, a, b, *args, **kwargs):
    macs = _prod(a.shape) * b.shape[-1]
    return 2 * macs + _prod(c.shape), macs


def _attention(q, k, v, *args, **kwargs):
    macs = _prod(q.shape) * k.shape[-2] + _prod(q.shape[:-1]) * k.shape[-2] * v.shape[-1]
    return 2 * macs, macs


FORMULAS = {   # (owner, name) -> (flops, macs) of a call's arguments
    (F, "linear"): lambda x, w, *a, **k: (2 * x.numel() * w.shape[0], x.numel() * w.shape[0]),
    (F, "relu"): lambda x, *a, **k: (x.numel(), 0), (F, "gelu"): lambda x, *a, **k: (x.numel(), 0),
    (F, "silu"): lambda x, *a, **k: (x.numel(), 0), (F, "softmax"): lambda x, *a, **k: (x.numel(), 0),
    (F, "layer_norm"): lambda x, shape, weight=None, *a, **k: (x.numel() * (5 if weight is not None else 4), 0),
    (F, "embedding"): lambda *a, **k: (0, 0), (F, "dropout"): lambda *a, **k: (0, 0),
    (F, "scaled_dot_product_attention"): _attention,
    (torch, "matmul"): _mm, (torch.Tensor, "matmul"): _mm, (torch.Tensor, "__matmul__"): _mm,
    (torch, "mm"): _mm, (torch.Tensor, "mm"): _mm, (torch, "bmm"): _mm, (torch.Tensor, "bmm"): _mm,
    (torch, "addmm"): _addmm, (torch, "baddbmm"): _addmm,
    (torch.Tensor, "addmm"): lambda c, a, b, *x, **k: _addmm(c, a, b),
    (torch, "mul"): lambda a, b, *x, **k: (_elements(a, b), 0), (torch.Tensor, "mul"): lambda a, b, *x, **k: (
        _elements(a, b), 0),
    (torch, "add"): lambda a, b, *x, **k: (_elements(a, b), 0), (torch.Tensor, "add"): lambda a, b, *x, **k: (
        _elements(a, b), 0),
}


def _wrap(original, formula):
    def counted(*args, **kwargs):
        if _stack:
            flops, macs = formula(*args, **kwargs)
            _stack[-1][0] += flops
            _stack[-1][1] += macs
        return original(*args, **kwargs)
    return counted


class FlopsProfiler:
    """``start_profile()`` before a forward, ``stop_profile()`` after it (counts kept), then
    ``print_model_profile()`` and ``end_profile()``. ``ds_engine``: the engine whose sizes and
    timers the summary reports (None: the model alone)."""

    def __init__(self, model: torch.nn.Module, ds_engine=None, recompute_fwd_factor: float = 0.0):
        self.model, self.ds_engine, self.recompute_fwd_factor = model, ds_engine, recompute_fwd_factor
        self.started, self._originals, self._handles = False, {}, []

    def start_profile(self, ignore_list=None) -> None:
        self.reset_profile()
        for (owner, name), formula in FORMULAS.items():
            original = getattr(owner, name)
            self._originals[owner, name] = original
            setattr(owner, name, _wrap(original, formula))
        for module in self.model.modules():
            if ignore_list and type(module) in ignore_list:
                continue
            self._handles += [module.register_forward_pre_hook(self._enter),
                              module.register_forward_hook(self._leave)]
        self.started = True

    @staticmethod
    def _enter(module, inputs) -> None:
        _stack.append([0, 0])
        get_accelerator().synchronize()   # the latency is this module's work, not what was queued before
        module.__start_time__ = time.time()

    @staticmethod
    def _leave(module, inputs, output) -> None:
        get_accelerator().synchronize()
        module.__duration__ += time.time() - module.__start_time__
        flops, macs = _stack.pop()
        module.__flops__ += flops
        module.__macs__ += macs

    def stop_profile(self) -> None:
        """Put torch's functions back and remove the hooks; the counts stay for the report."""
        for (owner, name), original in self._originals.items():
            setattr(owner, name, original)
        self._originals = {}
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def reset_profile(self) -> None:
        for module in self.model.modules():
            module.__flops__ = module.__macs__ = 0
            module.__duration__ = 0.0
            module.__params__ = sum(p.numel() for p in module.parameters() if p.requires_grad)

    def end_profile(self) -> None:
        if not self.started:
            return
        self.stop_profile()
        self.started = False
        for module in self.model.modules():
            for name in ("__flops__", "__macs__", "__duration__", "__params__", "__start_time__"):
                if hasattr(module, name):
                    delattr(module, name)

    def get_total_flops(self) -> int:
        return report.module_flops(self.model)

    def get_total_macs(self) -> int:
        return report.module_macs(self.model)

    def get_total_duration(self) -> float:
        return report.module_duration(self.model)

    def get_total_params(self) -> int:
        return self.model.__params__

    def print_model_profile(self, profile_step=1, module_depth=-1, top_modules=1, detailed=True, output_file=None):
        if self.started:
            report.print_model_profile(self, profile_step, module_depth, top_modules, detailed, output_file)
