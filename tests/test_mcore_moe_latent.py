"""Latent MoE and the weighted squared ReLU against Megatron-Core 0.19.2 (marked mcore).

1. --moe-latent-size: minitron's MoELayer and Megatron-Core's, the same weights loaded under the
   same names (fc1_latent_proj, fc2_latent_proj, experts L wide, a shared expert h wide), give
   the same output and gradients within 1e-5, with Nemotron-3's routed squared-ReLU experts
   and sigmoid router. Megatron builds the projections as Transformer Engine linears in
   "duplicated" mode, which need a GPU; here they are plain whole linears (what "duplicated"
   means on one rank), so the test holds everything around them: where they sit, their shapes,
   what runs in which width.
2. --use-fused-weighted-squared-relu: Megatron's fused function (relu(x)^2 times the routing
   weight, before fc2) followed by fc2, against minitron's unfused expert (the weight applied to
   fc2's output in the combine): the same numbers and gradients within 1e-6 in fp32.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from test_mcore_moe import _input, _nudged, against_megatrons_layer, trackers  # noqa: F401  (the fixture)
from test_mcore_peer import one_rank  # noqa: F401  (the fixture: both libraries' groups on one CPU rank)

pytestmark = pytest.mark.mcore
from megatron.core.transformer.moe import moe_layer as mcore_moe_layer  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig  # noqa: E402

from minitron.core.activations import squared_relu  # noqa: E402
from minitron.core.transformer import TransformerConfig  # noqa: E402
from minitron.core.transformer.moe.moe_layer import MoELayer  # noqa: E402

SHAPE = dict(num_layers=1, hidden_size=16, num_attention_heads=2, ffn_hidden_size=12, num_moe_experts=6,
             hidden_dropout=0.0, attention_dropout=0.0, moe_latent_size=8, moe_router_topk=3,
             moe_router_score_function="sigmoid", moe_router_topk_scaling_factor=2.5)
LATENT = {   # name: TransformerConfig fields both take
    "nemotron-3": dict(add_bias_linear=False, activation_func=squared_relu,
                       moe_shared_expert_intermediate_size=20, moe_router_enable_expert_bias=True),
    "with-biases": dict(moe_aux_loss_coeff=1e-2),
}


class _WholeLinear(torch.nn.Module):
    """TELinear(parallel_mode="duplicated") on one rank: y = x W^T + b, returned as (y, None)."""

    def __init__(self, input_size, output_size, *, config, init_method, bias, **_):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(output_size, input_size))
        init_method(self.weight)
        self.bias = torch.nn.Parameter(torch.zeros(output_size)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias), None


@pytest.mark.parametrize("name", list(LATENT))
def test_latent_moe_layer_equals_megatron_cores(one_rank, trackers, monkeypatch, name):
    from megatron.core.tensor_parallel import mappings as mcore_mappings

    one_rank_reduce = mcore_mappings._reduce   # as test_mcore_moe: the in-place p * bias on one rank
    monkeypatch.setattr(mcore_mappings, "_reduce", lambda input_, group: one_rank_reduce(input_, group).clone())
    monkeypatch.setattr(mcore_moe_layer, "HAVE_TE", True)
    monkeypatch.setattr(mcore_moe_layer, "TELinear", _WholeLinear)
    ours = _nudged(MoELayer(TransformerConfig(**SHAPE, **LATENT[name], init_seed=3), layer_number=1)).train()
    assert ours.experts.local_experts[0].linear_fc1.weight.shape == (12, 8)   # the experts work L-wide
    mconfig = McoreConfig(**SHAPE, **LATENT[name], moe_token_dispatcher_type="allgather",
                          use_cpu_initialization=True)
    w1, w2 = against_megatrons_layer(ours, mconfig, name)
    assert w1.keys() == w2.keys() and "fc2_latent_proj.weight" in w1, set(w1) ^ set(w2)
    worst = max((w1[k] - w2[k]).abs().max().item() for k in w1)
    assert worst <= 1e-5, f"{name}: gradients differ from Megatron-Core 0.19.2's by {worst:.2e}"


def test_fused_weighted_squared_relu_is_the_unfused_expert():
    from megatron.core.fusions.fused_weighted_squared_relu import weighted_squared_relu_impl

    generator = torch.Generator().manual_seed(7)
    x, probs = torch.randn(10, 12, generator=generator), torch.rand(10, 1, generator=generator)
    fc2 = torch.randn(16, 12, generator=generator)
    grads = {}
    for who in ("megatron", "minitron"):
        a, p = x.clone().requires_grad_(), probs.clone().requires_grad_()
        if who == "megatron":   # the weight inside the activation, before fc2
            y = F.linear(weighted_squared_relu_impl(a, p), fc2)
        else:                   # minitron's expert, then the combine's weight on its output
            y = F.linear(squared_relu(a), fc2) * p
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        grads[who] = (y.detach(), a.grad, p.grad)
    for ours, theirs in zip(grads["minitron"], grads["megatron"]):
        assert (ours - theirs).abs().max() <= 1e-5
