"""The newer routing options in minitron's default suite (test_mcore_moe_routing.py holds them
against Megatron-Core itself).

1. Sinkhorn's top-1 with the weight applied to the expert's input (--moe-apply-probs-on-input,
   the all-gather dispatcher): expert parallel 2 trains like one rank (lm loss within 1e-5 at
   every iteration). DeepSeek-V3's group-limited routing trains in test_mtp.py's model (sigmoid
   scores, the expert bias, top-2 inside one of two groups, the all-to-all dispatcher, at
   tensor x expert parallel 2 and pipeline parallel 2), which this file's budget shares.
2. group_limited_topk against a hand computation.
3. Forced balance: each expert-parallel rank draws its own random logits, the load is even,
   and the router's gradient passes straight through.
4. Refusals: one line each.
"""

import pytest
import torch
from distributed import pretrain_records, run_ranks
from test_moe import MODEL

from minitron.training.arguments import ArgumentError, build_parser, validate_args

SINKHORN_ON_INPUT = ["--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "0",
                     "--moe-router-topk", "1", "--moe-apply-probs-on-input", "--moe-token-dispatcher-type", "allgather"]
SHORT = ["--train-iters", "2", "--global-batch-size", "2"]   # two micro-batches a step, one per ep rank


def test_sinkhorn_probs_on_input_ep2_matches_serial(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    argv = MODEL + SHORT + SINKHORN_ON_INPUT
    serial = [r["lm_loss"] for r in pretrain_records(tmp_path / "serial", 1, argv)]
    ep2 = [r["lm_loss"] for r in pretrain_records(tmp_path / "ep2", 2, argv + ["--expert-model-parallel-size", "2"])]
    assert ep2 == pytest.approx(serial, abs=1e-5), f"{ep2} vs serial {serial}"
    assert serial[1] != serial[0]


def test_group_limited_topk_keeps_the_best_groups():
    from minitron.core.transformer.moe.moe_utils import group_limited_topk

    # 6 experts in 3 groups of 2; top-2 in 1 group: a group scores its best expert (2 // 1 = 2: both)
    scores = torch.tensor([[0.9, 0.0, 0.5, 0.5, 0.1, 0.8]])   # group sums 0.9, 1.0, 0.9
    values, experts = group_limited_topk(scores, 2, 1, 6, num_groups=3, group_topk=1)
    assert sorted(experts[0].tolist()) == [2, 3] and values[0].tolist() == [0.5, 0.5]
    # without the groups, experts 0 and 5


def _forced(rank):
    from minitron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from minitron.core.transformer import TransformerConfig
    from minitron.core.transformer.moe.router import TopKRouter

    model_parallel_cuda_manual_seed(11)
    config = TransformerConfig(num_layers=1, hidden_size=8, num_attention_heads=2, num_moe_experts=4,
                               moe_router_topk=2, moe_router_force_load_balancing=True, add_bias_linear=False)
    router = TopKRouter(config)
    x = torch.randn(64, 1, 8, requires_grad=True)
    probs, routing_map = router(x)
    probs.sum().backward()   # the random logits' gradient reaches the router as if they were its own
    return routing_map.tolist(), routing_map.sum(dim=0).tolist(), router.weight.grad.abs().sum().item() > 0


def test_forced_balance_draws_per_expert_rank():
    maps = run_ranks(_forced, world_size=2, ep=2)
    assert maps[0][0] != maps[1][0]   # each expert-parallel rank its own stream
    for _, counts, has_grad in maps:  # 128 choices over 4 experts: 32 each on average
        assert has_grad and sum(counts) == 128 and min(counts) >= 16, counts


@pytest.mark.parametrize("flags, words", [
    (["--moe-router-group-topk", "1"], "together"),
    (["--moe-router-num-groups", "3", "--moe-router-group-topk", "1"], "--num-experts 4 is not divisible"),
    (["--moe-router-num-groups", "2", "--moe-router-group-topk", "3"], "is more than --moe-router-num-groups 2"),
    (["--moe-router-num-groups", "4", "--moe-router-group-topk", "1"], "--moe-router-topk 2 must lie between"),
    (["--moe-router-load-balancing-type", "sinkhorn", "--moe-aux-loss-coeff", "1e-2"], "drop --moe-aux-loss-coeff"),
    (["--moe-router-load-balancing-type", "sinkhorn", "--moe-expert-capacity-factor", "1"], "Sinkhorn's"),
    (["--moe-apply-probs-on-input"], "needs --moe-router-topk 1, got 2"),
])
def test_routing_refusals(flags, words):
    base = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
            "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--num-experts", "4",
            "--distributed-backend", "gloo", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64"]
    args = build_parser().parse_args(base + flags)
    args.world_size, args.rank = 4, 0
    with pytest.raises(ArgumentError, match=words.replace("-", r"\-")):
        validate_args(args)
