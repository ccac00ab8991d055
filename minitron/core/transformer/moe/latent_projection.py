"""Latent MoE (--moe-latent-size L, Nemotron-3 Super and Ultra): the routed experts work in L < h.

    probs, routing_map = router(x)               the router still reads the whole h-wide token
    z = fc1_latent_proj(x)                       [T, h] -> [T, L], before the dispatch
    ... dispatch z, experts L -> ffn -> L, combine ...
    y = fc2_latent_proj(combined)                [T, L] -> [T, h], after the combine
    [y = y + shared_experts(x)]                  the shared expert stays h-wide

What travels is L wide instead of h (Super: 1024 of 4096), so the all-to-all carries a quarter
of the bytes, and every expert's fc1 and fc2 shrink by h / L; the price is two dense h x L
products per token, which every token pays once, not k times.

Megatron builds the two as Transformer Engine linears in "duplicated" mode: whole on every
tensor-parallel rank, no collective inside. Under sequence parallelism each tensor-parallel rank
projects only its own part of the sequence, so its gradient is a partial sum over the sequence:
the ``sequence_parallel`` mark has finalize_model_grads all-reduce it over tp, as it does a
norm's. They are dense parameters (not the experts'): averaged over the data-parallel group.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from minitron.core.tensor_parallel.weight_init import init_device


class DuplicatedLinear(torch.nn.Module):
    """y = x W^T (+ b), W [out, in] whole on every tensor-parallel rank (Megatron's
    parallel_mode "duplicated"). The weight is drawn on the host in fp32 from the layer's
    generator, as the router's is, so every tensor-parallel rank draws the same values; the bias
    starts at zero, as Transformer Engine starts it."""

    def __init__(self, config, input_size: int, output_size: int, init_method):
        super().__init__()
        dtype, device = config.params_dtype, init_device()
        self.weight = torch.nn.Parameter(torch.empty(output_size, input_size, dtype=dtype, device=device))
        self.bias = (torch.nn.Parameter(torch.zeros(output_size, dtype=dtype, device=device))
                     if config.add_bias_linear else None)
        if config.perform_initialization:
            drawn = torch.empty(self.weight.shape, dtype=torch.float32)  # host: drawn there
            init_method(drawn)
            with torch.no_grad():
                self.weight.copy_(drawn)
        for param in (self.weight, self.bias):
            if param is not None:   # each tp rank saw its part of the sequence: sum over tp
                param.sequence_parallel = config.sequence_parallel

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def latent_projections(config):
    """(fc1_latent_proj h -> L, fc2_latent_proj L -> h), Megatron's names and init methods, or
    (None, None) without --moe-latent-size."""
    latent = config.moe_latent_size
    if not latent:
        return None, None
    h = config.hidden_size
    return (DuplicatedLinear(config, h, latent, config.init_method),
            DuplicatedLinear(config, latent, h, config.output_layer_init_method))
