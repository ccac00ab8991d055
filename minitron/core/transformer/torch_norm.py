"""WrappedTorchNorm: torch's LayerNorm or RMSNorm, as the config says, labelled for sequence parallelism.

A norm's parameters are replicated on every TP rank. Without sequence parallelism every rank
normalises the same whole tensor and computes the same, whole gradient. With it, each rank
normalises only its part of the sequence, so each holds a *partial* gradient, and the parts
must be summed across the TP group before the optimizer step (finalize_model_grads does it for
every parameter marked ``sequence_parallel``).

``--normalization RMSNorm`` (LLaMA and most models since) drops LayerNorm's centring and its
bias: x / sqrt(mean(x^2) + eps) * weight. One reduction instead of two, and one parameter
vector instead of two; everything said above about sequence parallelism holds unchanged.

``--apply-layernorm-1p`` (Megatron's ``layernorm_zero_centered_gamma``) stores the scale as an
offset from one: the norm multiplies by ``1 + weight`` and ``weight`` starts at zero. Weight
decay then pulls the scale towards 1 rather than towards 0, and a bf16 weight near zero keeps
more significant bits than one near one. The function computed at initialisation is the same.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minitron.core.tensor_parallel.weight_init import init_device


class _ZeroCentredGamma:
    """The weight starts at 0, so that 1 + weight, the scale used, starts at 1."""

    def reset_parameters(self) -> None:
        super().reset_parameters()
        torch.nn.init.zeros_(self.weight)


class LayerNorm1P(_ZeroCentredGamma, torch.nn.LayerNorm):
    """LayerNorm scaled by (1 + weight): the zero-centred gamma of --apply-layernorm-1p."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.layer_norm(x, self.normalized_shape, self.weight + 1, self.bias, self.eps)


class RMSNorm1P(_ZeroCentredGamma, torch.nn.RMSNorm):
    """RMSNorm scaled by (1 + weight), as above."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.normalized_shape, self.weight + 1, self.eps)


def WrappedTorchNorm(config, hidden_size: int, eps: float | None = None) -> torch.nn.Module:
    """A LayerNorm or RMSNorm over the last dimension whose parameters carry the ``sequence_parallel`` mark.

    (A function with Megatron's class name: Megatron's WrappedTorchNorm also hands back a plain
    torch.nn.LayerNorm or torch.nn.RMSNorm from ``__new__``, chosen by ``config.normalization``.)
    """
    eps = config.layernorm_epsilon if eps is None else eps
    classes = {"LayerNorm": (torch.nn.LayerNorm, LayerNorm1P), "RMSNorm": (torch.nn.RMSNorm, RMSNorm1P)}
    norm_cls = classes[config.normalization][bool(config.layernorm_zero_centered_gamma)]
    norm = norm_cls(hidden_size, eps=eps, dtype=config.params_dtype, device=init_device())
    for param in norm.parameters():
        param.sequence_parallel = config.sequence_parallel
    return norm


class L2Norm(torch.nn.Module):
    """--qk-l2-norm (Llama 4): each head's query and key scaled to unit root-mean-square, with no
    weight. Unlike --qk-layernorm's norm it learns nothing, so a score's size is fixed by the
    softmax scale alone; with no parameter there is no gradient to sum over tensor-parallel ranks."""

    def __init__(self, hidden_size: int, eps: float = 1e-6):
        super().__init__()
        self.hidden_size, self.eps = hidden_size, eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x_float = x.float()   # the mean of squares in fp32, as an RMSNorm takes it
        return (x_float * torch.rsqrt(x_float.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x)
