"""Balancing the experts' load without (only) a loss: three ways a router is kept fair.

sinkhorn (--moe-router-load-balancing-type sinkhorn, S-BASE)
    Balanced assignment as an optimal-transport problem: exp(logits) [T, E] is rescaled, rows
    then columns, until every token carries mass 1/T and every expert 1/E; the top-k of the
    rescaled matrix is the choice. Only the choice comes from it (no gradient flows through the
    iterations); the weights are the router's own scores. It balances the tokens it is given:
    a rank's own, so sequence or context parallelism (each rank routing part of a sequence)
    balances a different set than one rank holding the whole sequence does.

apply_random_logits (--moe-router-force-load-balancing, Megatron's benchmarking option)
    The router's logits are replaced by standard normal noise, drawn from the expert-parallel
    RNG stream (so every expert-parallel rank draws its own): every expert gets about T*k/E
    tokens, the load a perfectly balanced router would give, whatever the weights. Backward
    passes the gradient straight through, as if the logits were the router's. The model learns
    nothing useful from such a routing: it measures the speed of a balanced MoE, not its loss.

get_updated_expert_bias, update_router_expert_bias, finish_router_step (DeepSeek-V3)
    The aux-loss-free expert bias moves by a fixed step after each global batch, up for
    starved experts, down for busy ones.
"""

from __future__ import annotations

import torch

from minitron.core import parallel_state
from minitron.core.tensor_parallel.random import get_cuda_rng_tracker, get_expert_parallel_rng_tracker_name
from minitron.trace import traced


def sinkhorn(cost: torch.Tensor, tol: float = 0.0001) -> torch.Tensor:
    """exp(cost) [T, E], scaled per row and per column until the column scales move by less than
    ``tol`` (mean absolute change): then each row sums to about 1/T and each column to about
    1/E. The scales are computed as Megatron computes them, (1/n) * 1/(sum + eps), since the
    top-k of the result decides near ties."""
    mass = torch.exp(cost)
    tokens, experts = mass.shape
    col = torch.ones(experts, device=mass.device, dtype=mass.dtype)
    eps = 1e-8   # no division by an empty row or column
    change = torch.tensor(float("inf"), device=mass.device)
    while change > tol:
        row = (1 / tokens) * 1 / ((col * mass).sum(dim=1) + eps)                 # rows to 1/T
        new_col = (1 / experts) * 1 / ((row.unsqueeze(1) * mass).sum(dim=0) + eps)   # columns to 1/E
        change, col = (col - new_col).abs().mean(), new_col
    return col * mass * row.unsqueeze(1)


class RandomSTE(torch.autograd.Function):
    """Forward: logits-shaped N(0, 1) noise from the expert-parallel stream. Backward: the
    gradient unchanged (a straight-through estimator), so the router still gets one."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor) -> torch.Tensor:
        with get_cuda_rng_tracker().fork(get_expert_parallel_rng_tracker_name()):
            return logits.clone().normal_()

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor) -> torch.Tensor:
        return grad_output


def apply_random_logits(logits: torch.Tensor) -> torch.Tensor:
    return RandomSTE.apply(logits)


def get_updated_expert_bias(tokens_per_expert: torch.Tensor, expert_bias: torch.Tensor,
                            expert_bias_update_rate: float, group) -> torch.Tensor:
    """Aux-loss-free balancing's step (DeepSeek-V3): sum the step's counts over every rank that
    routed tokens (tensor x data x context parallel), then move each expert's bias by
    ``rate`` towards balance: up if it got fewer than the mean, down if more (sign, not size)."""
    with torch.no_grad():
        torch.distributed.all_reduce(tokens_per_expert, group=group)
        average = tokens_per_expert.sum(dim=-1, keepdim=True) / tokens_per_expert.shape[-1]
        return expert_bias + torch.sign(average - tokens_per_expert) * expert_bias_update_rate


def _biased_routers(model) -> list:
    """The routers of these model chunks that carry an expert bias and are training."""
    return [m for chunk in model for m in chunk.modules()
            if getattr(m, "expert_bias", None) is not None and m.training]


def update_router_expert_bias(model, config) -> None:
    """Every router's expert bias moves one step: one stacked all-reduce of the counts for all
    of a rank's MoE layers (Megatron's _update_router_expert_bias)."""
    routers = _biased_routers(model)
    if not routers:   # a stage without MoE layers
        return
    counts = torch.stack([r.local_tokens_per_expert for r in routers])
    biases = torch.stack([r.expert_bias for r in routers])
    group = parallel_state.get_tensor_and_data_parallel_group(with_context_parallel=True)
    updated = get_updated_expert_bias(counts, biases, config.moe_router_bias_update_rate, group)
    for router, bias in zip(routers, updated):
        router.expert_bias.copy_(bias)


# The trace shows, per MoE layer of the rank, the bias this step routed with and this rank's counts.
@traced(args=lambda model, config: {
    "expert_bias": [[round(b, 6) for b in r.expert_bias.tolist()] for r in _biased_routers(model)],
    "tokens_per_expert": [[int(n) for n in r.local_tokens_per_expert.tolist()] for r in _biased_routers(model)]})
def finish_router_step(model, config) -> None:
    """After the step's backward (finalize_model_grads): the aux-loss-free bias update, then
    the routers' per-step counts start again (Megatron's reset_model_temporary_tensors)."""
    if config.moe_router_enable_expert_bias:
        update_router_expert_bias(model, config)
    for chunk in model:
        for module in chunk.modules():
            if getattr(module, "local_tokens_per_expert", None) is not None:
                module.local_tokens_per_expert.zero_()
            if hasattr(module, "reset_global_aux_loss_tracker"):
                module.reset_global_aux_loss_tracker()
