"""Megatron-Core's router options, in minitron's default suite (cheap; test_mcore_moe.py holds
them against Megatron-Core itself).

1. DeepSeek-V3's router on forked gloo ranks: sigmoid scores, the aux-loss-free expert bias
   (moved after every step), a top-k scaling factor, the z-loss, the sequence-level balance
   loss, fp64 routing, and biases on the router and the experts (expert tp 1). Tensor (sequence)
   parallel 2 x expert parallel 2 (on the same 2 ranks) trains like one rank: lm loss, both logged MoE losses.
2. The "position" drop policy keeps the first tokens, "probs" the most probable.
3. The expert bias's step: up by the rate for experts below the mean count, down above it.
4. Refusals: Megatron's rules for these flags, one line each.
"""

import pytest
import torch
from distributed import pretrain_records
from test_moe import MODEL

from minitron.training.arguments import ArgumentError, build_parser, validate_args

DEEPSEEK = ["--moe-router-score-function", "sigmoid", "--moe-router-enable-expert-bias",
            "--moe-router-bias-update-rate", "1e-2", "--moe-router-topk-scaling-factor", "2.5",
            "--moe-z-loss-coeff", "1e-3", "--moe-router-load-balancing-type", "seq_aux_loss",
            "--moe-router-dtype", "fp64"]
# Two iterations of one micro-batch: the second routes with the bias the first moved.
# Megatron's default dispatcher, the all-gather, over tp x ep = 2 ranks.
BIASED = [flag for flag in MODEL if flag != "--disable-bias-linear"] + DEEPSEEK + [
    "--train-iters", "2", "--global-batch-size", "1", "--moe-token-dispatcher-type", "allgather"]


def test_deepseek_router_tp2_ep2_matches_serial(tmp_path, monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")   # the serial rank alone would take every core's thread
    serial = pretrain_records(tmp_path / "serial", 1, BIASED)
    layout = pretrain_records(tmp_path / "tp2-ep2", 2, BIASED + ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                                      "--expert-model-parallel-size", "2",
                                                      "--expert-tensor-parallel-size", "1"])
    for key in ("lm_loss", "seq_load_balancing_loss", "z_loss"):
        ours, theirs = [r[key] for r in layout], [r[key] for r in serial]
        assert ours == pytest.approx(theirs, abs=1e-5), f"{key}: {ours} vs serial {theirs}"
    assert "load_balancing_loss" not in serial[0]   # seq_aux_loss is logged under its own name
    assert serial[-1]["lm_loss"] != serial[0]["lm_loss"]


def test_position_policy_keeps_the_first_tokens():
    from minitron.core.transformer.moe.moe_utils import apply_router_token_dropping

    # 6 tokens, top-1, 3 experts: capacity 2. Five tokens chose expert 0.
    probs = torch.tensor([[.5, 0, 0], [.9, 0, 0], [.6, 0, 0], [0, 0, .7], [.8, 0, 0], [.55, 0, 0]])
    routing_map = probs > 0
    _, by_probs = apply_router_token_dropping(probs, routing_map, 1, 1.0, drop_policy="probs")
    _, by_position = apply_router_token_dropping(probs, routing_map, 1, 1.0, drop_policy="position")
    assert by_probs[:, 0].nonzero().flatten().tolist() == [1, 4]
    # "position" ignores the probabilities: two of the five that chose expert 0, as torch.topk
    # picks among equal ones (Megatron's computation; test_mcore_moe.py holds it to Megatron's)
    kept = by_position[:, 0].nonzero().flatten().tolist()
    assert len(kept) == 2 and all(routing_map[t, 0] for t in kept) and kept != [1, 4]
    assert by_position[:, 2].nonzero().flatten().tolist() == [3]


def test_sigmoid_scores_choose_with_the_bias_and_weigh_without_it():
    from minitron.core.transformer.moe.moe_utils import topk_routing_with_score_function

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    bias = torch.tensor([0.0, 0.0, 0.0, 1.0])   # lifts expert 3 above expert 1
    probs, routing_map = topk_routing_with_score_function(logits, 2, score_function="sigmoid", expert_bias=bias)
    assert routing_map[0].tolist() == [True, False, False, True]
    s0, s3 = torch.sigmoid(torch.tensor(2.0)), torch.sigmoid(torch.tensor(-1.0))
    assert probs[0, 0].item() == pytest.approx((s0 / (s0 + s3)).item())


def _bias_step(rank):
    from minitron.core.transformer.moe.moe_utils import get_updated_expert_bias

    counts = torch.tensor([[3.0, 1.0, 2.0, 2.0]]) if rank == 0 else torch.tensor([[1.0, 1.0, 2.0, 4.0]])
    return get_updated_expert_bias(counts, torch.zeros(1, 4), 0.5, group=None).tolist()


def test_expert_bias_steps_towards_balance():
    from distributed import run_ranks

    # summed over both ranks: [4, 2, 4, 6], mean 4: expert 1 up, expert 3 down, the others stay
    assert run_ranks(_bias_step, world_size=2) == [[[0.0, 0.5, 0.0, -0.5]]] * 2


@pytest.mark.parametrize("flags, words", [
    (["--moe-router-topk", "1"], "add --moe-router-pre-softmax"),
    (["--moe-router-enable-expert-bias"], "add --moe-router-score-function sigmoid"),
    (["--tensor-model-parallel-size", "2", "--sequence-parallel"], "add --disable-bias-linear, or"),
    (["--moe-shared-expert-intermediate-size", "32"], "shared experts have no biases"),
    (["--disable-bias-linear", "--moe-shared-expert-intermediate-size", "33", "--tensor-model-parallel-size", "2",
      "--sequence-parallel"], "33 is not divisible by --tensor-model-parallel-size 2"),
    (["--moe-router-score-function", "sinkhorn"], "invalid choice"),
])
def test_router_refusals(flags, words):
    base = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
            "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data", "--num-experts", "4",
            "--distributed-backend", "gloo", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64"]
    with pytest.raises((ArgumentError, SystemExit)) as refused:
        args = build_parser().parse_args(base + flags)
        args.world_size, args.rank = 4, 0
        validate_args(args)
    if refused.type is ArgumentError:
        assert words in str(refused.value)


def test_dense_model_refuses_router_flags():
    base = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
            "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
            "--tokenizer-type", "NullTokenizer", "--vocab-size", "64"]
    with pytest.raises(ArgumentError, match="--moe-z-loss-coeff is for a mixture of experts"):
        args = build_parser().parse_args(base + ["--moe-z-loss-coeff", "1e-3"])
        args.world_size, args.rank = 1, 0
        validate_args(args)
