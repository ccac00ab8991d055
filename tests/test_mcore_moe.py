"""minitron's MoE against Megatron-Core 0.19.2's own, weight for weight (marked mcore).

1. The router, for each routing option minitron implements under Megatron's name: the same
   config fields and weights give the same probs and routing map, the same logged balance /
   z-loss values, and the same gradients (the input's and the router's: the aux losses reach
   them through MoEAuxLossAutoScaler) within 1e-6; with the expert bias, the same step of it.
2. The whole MoE layer (Megatron's local spec: SequentialMLP; one rank, where its dispatcher
   moves nothing): output and every parameter's gradient, with expert biases, shared experts, capacity,
   gated (SwiGLU) experts.

One rank on the CPU, as tests/test_mcore_peer.py runs Megatron's GPTModel (its fixture).
"""

from __future__ import annotations

import pytest
import torch
from test_mcore_peer import one_rank  # noqa: F401  (the fixture: both libraries' groups on one CPU rank)

pytestmark = pytest.mark.mcore
from megatron.core.models.gpt.moe_module_specs import get_moe_module_spec  # noqa: E402
from megatron.core.transformer.moe import moe_logging as mcore_logging  # noqa: E402
from megatron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler as McoreScaler  # noqa: E402
from megatron.core.transformer.moe.moe_utils import get_default_pg_collection  # noqa: E402
from megatron.core.transformer.moe.router import TopKRouter as McoreRouter  # noqa: E402
from megatron.core.transformer.transformer_config import TransformerConfig as McoreConfig  # noqa: E402

from minitron.core.transformer import TransformerConfig  # noqa: E402
from minitron.core.transformer.moe import moe_logging  # noqa: E402
from minitron.core.transformer.moe.moe_layer import MoELayer  # noqa: E402
from minitron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler, update_router_expert_bias  # noqa: E402
from minitron.core.transformer.moe.router import TopKRouter  # noqa: E402

SHAPE = dict(num_layers=1, hidden_size=16, num_attention_heads=2, ffn_hidden_size=32, num_moe_experts=6,
             hidden_dropout=0.0, attention_dropout=0.0)
SEQ, BATCH, TOL = 5, 3, 1e-6
ROUTERS = {   # name: TransformerConfig fields both take
    "softmax-aux": dict(moe_aux_loss_coeff=1e-2),
    "pre-softmax-scaled": dict(moe_router_pre_softmax=True, moe_router_topk_scaling_factor=2.0,
                               moe_aux_loss_coeff=1e-2),
    "topk1-pre-softmax": dict(moe_router_topk=1, moe_router_pre_softmax=True, moe_aux_loss_coeff=1e-2),
    "sigmoid-expert-bias": dict(moe_router_score_function="sigmoid", moe_router_enable_expert_bias=True,
                                moe_router_topk_scaling_factor=2.5, moe_aux_loss_coeff=1e-2),
    "seq-aux-z-loss": dict(moe_router_load_balancing_type="seq_aux_loss", moe_aux_loss_coeff=1e-2,
                           moe_z_loss_coeff=1e-3),
    "global-aux": dict(moe_router_load_balancing_type="global_aux_loss", moe_aux_loss_coeff=1e-2),
    "none-fp64": dict(moe_router_load_balancing_type="none", moe_router_dtype="fp64"),
    "capacity-probs": dict(moe_expert_capacity_factor=1.0, moe_aux_loss_coeff=1e-2),
    "capacity-position-pad": dict(moe_expert_capacity_factor=1.0, moe_token_drop_policy="position",
                                  moe_pad_expert_input_to_capacity=True),
    "no-router-bias": dict(add_bias_linear=False, moe_aux_loss_coeff=1e-2),
}


def _both_all_gather_dispatchers(rank):
    """On each of 2 expert-parallel ranks: Megatron's all-gather dispatcher and minitron's, fed
    the same tokens and routing; what reaches the local experts, and what comes home."""
    from megatron.core import parallel_state as mcore_parallel_state
    from megatron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher as McoreAllGather

    from minitron.core.transformer.moe.token_dispatcher import MoEAllGatherTokenDispatcher

    torch.cuda.current_device = lambda: "cpu"   # a forked rank of its own: nothing to restore
    mcore_parallel_state.initialize_model_parallel(1, 1, expert_model_parallel_size=2)
    fields = dict(SHAPE, num_moe_experts=4, moe_token_dispatcher_type="allgather")
    local = [2 * rank, 2 * rank + 1]
    ours = MoEAllGatherTokenDispatcher(2, local, TransformerConfig(**fields))
    theirs = McoreAllGather(2, local, McoreConfig(**fields, use_cpu_initialization=True),
                            pg_collection=get_default_pg_collection())
    generator = torch.Generator().manual_seed(rank)
    hidden = torch.randn(SEQ, 1, SHAPE["hidden_size"], generator=generator)
    top = torch.randn(SEQ, 4, generator=generator).topk(2, dim=1)
    routing_map = torch.zeros(SEQ, 4, dtype=torch.bool).scatter(1, top.indices, True)
    probs = torch.zeros(SEQ, 4).scatter(1, top.indices, torch.softmax(top.values, dim=1))
    tokens, counts = ours.token_permutation(hidden, probs, routing_map)
    h, p = theirs.dispatch_preprocess(hidden, routing_map, probs)
    their_tokens, their_counts, their_probs = theirs.dispatch_postprocess(*theirs.token_dispatch(h, p))
    expert_output = torch.tanh(tokens) * 3   # any function of the rows, the same for both
    home = ours.token_unpermutation(expert_output)
    # Megatron's experts weight their own rows (the routing weight travels with them)
    their_home = theirs.combine_preprocess(expert_output * their_probs.unsqueeze(-1))
    their_home = theirs.combine_postprocess(theirs.token_combine(their_home))
    mcore_parallel_state.destroy_model_parallel()
    return {"tokens": torch.equal(tokens, their_tokens), "counts": counts.tolist() == their_counts.tolist(),
            "home": (home - their_home).abs().max().item()}


def test_all_gather_dispatcher_equals_megatron_cores_on_two_ranks():
    """First in the file: forked after the one-rank tests below, the ranks hung here."""
    from distributed import run_ranks

    for rank in run_ranks(_both_all_gather_dispatchers, world_size=2, ep=2):
        assert rank["tokens"] and rank["counts"] and rank["home"] <= TOL, rank


@pytest.fixture
def trackers():
    """Both libraries' aux-loss records, empty before and after; the autoscalers at scale 1."""
    mcore_logging.destroy_moe_metrics_tracker()
    moe_logging._MOE_LAYER_WISE_LOGGING_TRACKER.clear()
    McoreScaler.main_loss_backward_scale = None
    MoEAuxLossAutoScaler.main_loss_backward_scale = None
    yield
    mcore_logging.destroy_moe_metrics_tracker()
    moe_logging._MOE_LAYER_WISE_LOGGING_TRACKER.clear()


def _nudged(module):
    """Every parameter off its initial value (biases start at 0), the same way in both."""
    with torch.no_grad():
        for param in module.parameters():
            param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(param.numel())) * 0.3)
    return module


def _input():
    return torch.randn(SEQ, BATCH, SHAPE["hidden_size"], generator=torch.Generator().manual_seed(2))

def routers_agree(ours, theirs, name):
    """Both routers on the same input, backward through the same weighting of their probabilities:
    the routing maps must be equal and the probabilities and the input's gradients within TOL;
    returns the routing map and each side's parameter gradients (ours, theirs)."""
    weights = torch.randn(SEQ * BATCH, SHAPE["num_moe_experts"], generator=torch.Generator().manual_seed(4))
    out = {}
    for who, router in (("ours", ours), ("theirs", theirs)):
        x = _input().requires_grad_()
        probs, routing_map = router(x)
        (probs * weights).sum().backward()
        out[who] = (probs.detach(), routing_map, x.grad, {n: p.grad for n, p in router.named_parameters()})
    (p1, m1, g1, w1), (p2, m2, g2, w2) = out["ours"], out["theirs"]
    assert torch.equal(m1, m2), f"{name}: the routing maps differ"
    assert (p1 - p2).abs().max() <= TOL and (g1 - g2).abs().max() <= TOL, name
    return m1, w1, w2


def against_megatrons_layer(ours, mconfig, name):
    """Megatron-Core's local-spec MoE layer built from ``mconfig`` and loaded with ``ours``'s
    weights; both run forward and backward on the same input. The outputs and the input's
    gradients must agree within 1e-5; returns each side's parameter gradients (ours, theirs)."""
    build = get_moe_module_spec(use_te=False, num_experts=mconfig.num_moe_experts, moe_grouped_gemm=False)
    theirs = build(config=mconfig, layer_number=1).train()
    missing, unexpected = theirs.load_state_dict(ours.state_dict(), strict=False)
    assert not unexpected and all(k.endswith("_extra_state") for k in missing), (missing, unexpected)
    out = {}
    for who, layer in (("ours", ours), ("theirs", theirs)):
        x = _input().requires_grad_()
        y, _ = layer(x)
        (y * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
        out[who] = (y.detach(), x.grad, {n: p.grad for n, p in layer.named_parameters()})
    (y1, g1, w1), (y2, g2, w2) = out["ours"], out["theirs"]
    assert (y1 - y2).abs().max() <= 1e-5 and (g1 - g2).abs().max() <= 1e-5, name
    return w1, w2



@pytest.mark.parametrize("name", list(ROUTERS))
def test_router_equals_megatron_cores(one_rank, trackers, name):
    fields = ROUTERS[name]
    ours = _nudged(TopKRouter(TransformerConfig(**SHAPE, **fields, init_seed=3))).train()
    theirs = McoreRouter(McoreConfig(**SHAPE, **fields, use_cpu_initialization=True),
                         pg_collection=get_default_pg_collection()).train()
    theirs.set_layer_number(1)
    theirs.load_state_dict(ours.state_dict())
    if ours.expert_bias is not None:   # a bias that already moved, so that it changes the choice
        for router in (ours, theirs):
            router.expert_bias.copy_(torch.tensor([0.0, 0.3, -0.2, 0.1, 0.0, -0.1]))
    _, w1, w2 = routers_agree(ours, theirs, name)
    assert w1.keys() == w2.keys() and all((w1[k] - w2[k]).abs().max() <= TOL for k in w1)
    logged = {k: v.values for k, v in mcore_logging.get_moe_metrics_tracker().metrics.items()}
    assert logged.keys() == moe_logging._MOE_LAYER_WISE_LOGGING_TRACKER.keys()
    for key, values in logged.items():
        assert torch.allclose(moe_logging._MOE_LAYER_WISE_LOGGING_TRACKER[key], values.float(), atol=TOL), key
    if ours.expert_bias is not None:   # the step after it: Megatron's finalize_model_grads' update
        from megatron.core.distributed.finalize_model_grads import _update_router_expert_bias

        update_router_expert_bias([ours], ours.config)
        _update_router_expert_bias([theirs], theirs.config)
        assert torch.allclose(ours.expert_bias, theirs.expert_bias)


LAYERS = {   # name: TransformerConfig fields both take
    "experts-with-biases": dict(moe_aux_loss_coeff=1e-2),
    "shared-expert": dict(add_bias_linear=False, moe_shared_expert_intermediate_size=24, moe_aux_loss_coeff=1e-2),
    "capacity-padded": dict(moe_expert_capacity_factor=1.0, moe_pad_expert_input_to_capacity=True),
    # --swiglu: gated experts (fc1's [gate | up], with biases) and a gated shared expert
    "gated-experts-with-biases": dict(gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                                      moe_aux_loss_coeff=1e-2),
    "gated-shared-expert": dict(gated_linear_unit=True, activation_func=torch.nn.functional.silu,
                                add_bias_linear=False, moe_shared_expert_intermediate_size=24),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_moe_layer_equals_megatron_cores(one_rank, trackers, monkeypatch, name):
    # With biases, Megatron's expert adds p * bias to fc2's output in place; on one rank its
    # row-parallel all-reduce hands back its input itself, which autograd forbids changing in
    # place (on a GPU, Transformer Engine's layers are used instead). A copy changes no number.
    from megatron.core.tensor_parallel import mappings as mcore_mappings

    one_rank_reduce = mcore_mappings._reduce
    monkeypatch.setattr(mcore_mappings, "_reduce", lambda input_, group: one_rank_reduce(input_, group).clone())
    # Megatron's all-to-all dispatcher makes CUDA streams when built; on one rank its default
    # all-gather one moves nothing either, and the layer's numbers are the dispatcher-free ones.
    fields = dict(LAYERS[name], moe_token_dispatcher_type="allgather")
    config = TransformerConfig(**SHAPE, **LAYERS[name], init_seed=3)
    ours = _nudged(MoELayer(config, layer_number=1)).train()
    mconfig = McoreConfig(**SHAPE, **fields, use_cpu_initialization=True)
    w1, w2 = against_megatrons_layer(ours, mconfig, name)
    assert w1.keys() == w2.keys(), set(w1) ^ set(w2)
    worst = max((w1[k] - w2[k]).abs().max().item() for k in w1)
    assert worst <= 1e-5, f"{name}: gradients differ from Megatron-Core 0.19.2's by {worst:.2e}"

