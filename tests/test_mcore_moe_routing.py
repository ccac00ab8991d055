"""minitron's newer routing options against Megatron-Core 0.19.2's TopKRouter and MoE layer
(marked mcore): group-limited routing (DeepSeek-V3's node-limited choice, with sigmoid scores
and the expert bias), Sinkhorn balancing (training and eval), forced balance with random
logits, and the routing weights applied to the experts' input.

The same config fields and weights give the same routing map, the same probabilities, the same
gradients (input's and router's) within 1e-6, and for the layer the same output and parameter
gradients within 1e-5. One rank on the CPU (test_mcore_peer's fixture), as test_mcore_moe.py.
"""

from __future__ import annotations

import pytest
import torch
from test_mcore_moe import SHAPE, TOL, against_megatrons_layer, routers_agree, _input, _nudged, trackers  # noqa: F401  (trackers: a fixture)
from test_mcore_peer import one_rank  # noqa: F401  (the fixture: both libraries' groups on one CPU rank)

pytestmark = pytest.mark.mcore
from megatron.core.transformer.moe.moe_utils import get_default_pg_collection  # noqa: E402
from megatron.core.transformer.moe.router import TopKRouter as McoreRouter  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig  # noqa: E402

from minitron.core.transformer import TransformerConfig  # noqa: E402
from minitron.core.transformer.moe.moe_layer import MoELayer  # noqa: E402
from minitron.core.transformer.moe.router import TopKRouter  # noqa: E402

GROUPS = dict(moe_router_num_groups=3, moe_router_group_topk=2)   # 6 experts: 3 groups of 2
ROUTERS = {   # name: (TransformerConfig fields both take, train or eval)
    "groups-softmax-aux": (dict(GROUPS, moe_router_topk=3, moe_aux_loss_coeff=1e-2), True),
    "groups-pre-softmax": (dict(GROUPS, moe_router_pre_softmax=True, moe_router_topk=3), True),
    # DeepSeek-V3's router: sigmoid, the expert bias on the choice, top-4 in 2 of the groups
    "groups-sigmoid-expert-bias": (dict(GROUPS, moe_router_topk=4, moe_router_score_function="sigmoid",
                                        moe_router_enable_expert_bias=True, moe_router_topk_scaling_factor=2.5,
                                        moe_router_load_balancing_type="seq_aux_loss", moe_aux_loss_coeff=1e-2),
                                   True),
    "groups-one-kept": (dict(moe_router_num_groups=2, moe_router_group_topk=1, moe_router_topk=2), True),
    "sinkhorn-top1": (dict(moe_router_load_balancing_type="sinkhorn", moe_router_topk=1), True),
    "sinkhorn-top2-z-loss": (dict(moe_router_load_balancing_type="sinkhorn", moe_z_loss_coeff=1e-3), True),
    "sinkhorn-top2-eval": (dict(moe_router_load_balancing_type="sinkhorn"), False),
    # random logits from each library's expert-parallel stream, both seeded 5 by the fixture
    "force-load-balancing": (dict(moe_router_force_load_balancing=True, moe_aux_loss_coeff=1e-2), True),
    "force-load-balancing-groups": (dict(GROUPS, moe_router_force_load_balancing=True), True),
}


@pytest.mark.parametrize("name", list(ROUTERS))
def test_router_equals_megatron_cores(one_rank, trackers, name):
    fields, training = ROUTERS[name]
    ours = _nudged(TopKRouter(TransformerConfig(**SHAPE, **fields, init_seed=3))).train(training)
    theirs = McoreRouter(McoreConfig(**SHAPE, **fields, use_cpu_initialization=True),
                         pg_collection=get_default_pg_collection()).train(training)
    theirs.set_layer_number(1)
    theirs.load_state_dict(ours.state_dict())
    if ours.expert_bias is not None:   # a bias that changes the choice
        for router in (ours, theirs):
            router.expert_bias.copy_(torch.tensor([0.0, 0.3, -0.2, 0.1, 0.0, -0.1]))
    m1, w1, w2 = routers_agree(ours, theirs, name)
    assert w1.keys() == w2.keys() and all((w1[k] - w2[k]).abs().max() <= TOL for k in w1), name
    if "groups" in name and "force" not in name:   # every token's experts lie in group_topk groups
        per_group = m1.reshape(m1.shape[0], fields["moe_router_num_groups"], -1).any(dim=-1)
        assert (per_group.sum(dim=-1) <= fields["moe_router_group_topk"]).all()



LAYERS = {   # name: TransformerConfig fields both take
    "probs-on-input-with-biases": dict(moe_router_topk=1, moe_router_pre_softmax=True, moe_apply_probs_on_input=True,
                                       moe_aux_loss_coeff=1e-2),
    "probs-on-input-gated-padded": dict(moe_router_topk=1, moe_router_pre_softmax=True, moe_apply_probs_on_input=True,
                                        gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                                        add_bias_linear=False, moe_expert_capacity_factor=1.0,
                                        moe_pad_expert_input_to_capacity=True),
    "groups-sigmoid": dict(GROUPS, moe_router_score_function="sigmoid", add_bias_linear=False),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_moe_layer_equals_megatron_cores(one_rank, trackers, monkeypatch, name):
    from megatron.core.tensor_parallel import mappings as mcore_mappings

    # As test_mcore_moe.py: on one rank Megatron's row-parallel all-reduce hands back its input,
    # which its expert then changes in place; a copy changes no number.
    one_rank_reduce = mcore_mappings._reduce
    monkeypatch.setattr(mcore_mappings, "_reduce", lambda input_, group: one_rank_reduce(input_, group).clone())
    config = TransformerConfig(**SHAPE, **LAYERS[name], init_seed=3)
    ours = _nudged(MoELayer(config, layer_number=1)).train()
    mconfig = McoreConfig(**SHAPE, **LAYERS[name], moe_token_dispatcher_type="allgather", use_cpu_initialization=True)
    w1, w2 = against_megatrons_layer(ours, mconfig, name)
    assert w1.keys() == w2.keys(), set(w1) ^ set(w2)
    worst = max((w1[k] - w2[k]).abs().max().item() for k in w1)
    assert worst <= 1e-5, f"{name}: gradients differ from Megatron-Core 0.19.2's by {worst:.2e}"
