"""WrappedTorchNorm: torch's LayerNorm or RMSNorm, as the config says, labelled for sequence parallelism.

A norm's parameters are replicated on every TP rank. Without sequence parallelism every rank
normalises the same whole tensor and computes the same, whole gradient. With it, each rank
normalises only its part of the sequence, so each holds a *partial* gradient, and the parts
must be summed across the TP group before the optimizer step (finalize_model_grads does it for
every parameter marked ``sequence_parallel``).

``--normalization RMSNorm`` (LLaMA and most models since) drops LayerNorm's centring and its
bias: x / sqrt(mean(x^2) + eps) * weight. One reduction instead of two, and one parameter
vector instead of two; everything said above about sequence parallelism holds unchanged.
"""

from __future__ import annotations

import torch


def WrappedTorchNorm(config, hidden_size: int, eps: float | None = None) -> torch.nn.Module:
    """A LayerNorm or RMSNorm over the last dimension whose parameters carry the ``sequence_parallel`` mark.

    (A function with Megatron's class name: Megatron's WrappedTorchNorm also hands back a plain
    torch.nn.LayerNorm or torch.nn.RMSNorm from ``__new__``, chosen by ``config.normalization``.)
    """
    eps = config.layernorm_epsilon if eps is None else eps
    norm_cls = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}[config.normalization]
    norm = norm_cls(hidden_size, eps=eps, dtype=config.params_dtype)
    for param in norm.parameters():
        param.sequence_parallel = config.sequence_parallel
    return norm
