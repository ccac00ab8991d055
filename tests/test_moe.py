"""Mixture of experts: a 4-expert top-2 GPT trains like its serial self in every expert layout,
and the dispatcher's pieces do what the chapter says.

1. pretrain_gpt on forked gloo ranks (as test_training_equivalence.py does), dropout off, the
   load-balancing loss on (coefficient 1e-2, so its gradient moves the router): per-iteration lm
   loss within 1e-5 of the serial run, the logged load_balancing_loss too, in layouts with expert
   parallelism alone, with tensor (and expert tensor) parallelism, inside data parallelism (with
   the distributed optimizer), and across pipeline stages, the second of which holds no MoE layer
   (there with --moe-grouped-gemm); with the all-to-all dispatcher, and at tp 2 x ep 2 with the
   all-gather one too, so the two dispatchers compute the same.
2. permute / unpermute: rows grouped by expert, and back.
3. the all-to-all dispatcher on 2 ranks with identity experts: every token comes home whole.
4. the switch loss against a hand computation, and the autoscaler's gradient.
5. a checkpoint of the dp4-ep2 run, one directory per expert-parallel rank, resumes exactly.
6. capacity: padded to capacity, ep 2 equals serial; tokens beyond capacity are dropped lowest
   probability first (Megatron's "probs" policy); bad capacity flags are refused in one line.
"""

import json

import pytest
import torch
from distributed import pretrain_records, run_ranks

from minitron.training.arguments import ArgumentError, build_parser, validate_args

ITERS = 3
# Layer 1 is an MoE layer, layer 2 dense (--moe-layer-freq 2): with pp 2 the second stage has none.
# The all-to-all dispatcher unless a layout says otherwise (Megatron's default is the all-gather).
MOE = ["--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "1e-2", "--moe-layer-freq", "2",
       "--moe-token-dispatcher-type", "alltoall"]
MODEL = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", str(ITERS), "--lr", "1e-2",
         "--mock-data", "--vocab-size", "127", "--make-vocab-size-divisible-by", "32",  # 128 rows at tp 1 and 2
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7", "--distributed-backend", "gloo",
         "--disable-bias-linear", *MOE]   # no biases: expert tp 2 allows none (the router test below has them)


def run(tmp_path, name, world, *flags):
    argv = MODEL + list(flags)
    if "--save-interval" in flags:
        argv += ["--save", str(tmp_path / "checkpoints"), "--ckpt-format", "torch"]   # one directory per ep rank
    records = pretrain_records(tmp_path / name, world, argv)
    return [r["lm_loss"] for r in records], [r["load_balancing_loss"] for r in records]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return run(tmp_path_factory.mktemp("serial"), "serial", 1)


EP = ["--expert-model-parallel-size", "2"]
LAYOUTS = {   # name: (world, flags)
    "ep2": (2, EP),
    "ep2-tp2": (4, EP + ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),   # expert tp 2 too
    "dp4-ep2-distopt": (4, EP + ["--use-distributed-optimizer", "--save-interval", "2"]),   # saves (below)
    "ep2-pp2": (4, EP + ["--pipeline-model-parallel-size", "2", "--moe-grouped-gemm"]),   # 2 experts, one bmm
    # every rank of the tp x ep group (4) gathers all its tokens; expert tp 2 slices each expert
    "ep2-tp2-allgather": (4, EP + ["--tensor-model-parallel-size", "2", "--sequence-parallel",
                                   "--moe-token-dispatcher-type", "allgather"]),
    "cp2-ep2": (4, EP + ["--context-parallel-size", "2"]),   # the switch loss scaled by cp
}


_DONE = {}   # layout name -> (its tmp_path, its lm losses), for the checkpoint test below


def layout_run(tmp_path, name):
    if name not in _DONE:
        world, flags = LAYOUTS[name]
        _DONE[name] = tmp_path, run(tmp_path, name, world, *flags)
    return _DONE[name][1]


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_moe_layout_matches_serial(tmp_path, serial, name):
    losses, balance = layout_run(tmp_path, name)
    serial_losses, serial_balance = serial
    assert losses == pytest.approx(serial_losses, abs=1e-5), f"{name}: {losses} vs serial {serial_losses}"
    assert balance == pytest.approx(serial_balance, abs=1e-5), f"{name}: {balance} vs serial {serial_balance}"
    assert losses[-1] != losses[0] and balance[-1] != balance[0]   # the weights and the routing moved
    assert all(b >= 1.0 - 1e-6 for b in balance)   # E * sum f_i P_i is 1 when perfectly balanced, else more


def test_moe_checkpoint_resumes_where_it_stopped(tmp_path_factory):
    """Each expert-parallel rank's experts get a directory of their own (mp_rank_TT_EEE): resuming
    the dp4-ep2 run from its iteration-2 checkpoint repeats its third iteration."""
    losses, _ = layout_run(tmp_path_factory.mktemp("resume"), "dp4-ep2-distopt")
    tmp_path, world = _DONE["dp4-ep2-distopt"][0], LAYOUTS["dp4-ep2-distopt"][0]
    ck = tmp_path / "checkpoints"
    assert sorted(p.name for p in (ck / "iter_0000002").glob("mp_rank_*")) == ["mp_rank_00_000", "mp_rank_00_001"]
    (ck / "latest_checkpointed_iteration.txt").write_text("2")   # resume from the middle
    resumed, _ = run(tmp_path, "resumed", world, *EP, "--use-distributed-optimizer", "--load", str(ck))
    assert resumed == pytest.approx(losses[2:], abs=1e-6)


CAPACITY = ["--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity"]


def test_capacity_padded_ep2_matches_serial(tmp_path, monkeypatch):
    """Capacity 1.0 drops tokens (the losses differ from dropless) and padding fills every
    expert to its capacity: expert parallel still computes what one rank computes."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")   # the serial rank alone would take every core's thread
    serial, serial_balance = run(tmp_path, "serial-capacity", 1, *CAPACITY)
    losses, balance = run(tmp_path, "ep2-capacity", 2, *EP, *CAPACITY)
    assert losses == pytest.approx(serial, abs=1e-5) and balance == pytest.approx(serial_balance, abs=1e-5)


def test_tokens_beyond_capacity_are_dropped_lowest_probability_first():
    from minitron.core.transformer.moe.moe_utils import apply_router_token_dropping, get_capacity

    # 6 tokens, 3 experts, top-1: five tokens choose expert 0, one expert 2. Capacity at factor
    # 1.0 is ceil(6 x 1 / 3) = 2, so expert 0 keeps its two most probable tokens (1 and 4).
    probs = torch.tensor([[.5, 0, 0], [.9, 0, 0], [.6, 0, 0], [0, 0, .7], [.8, 0, 0], [.55, 0, 0]])
    routing_map = probs > 0
    assert get_capacity(6, 3, 1.0) == 2
    kept_probs, kept = apply_router_token_dropping(probs, routing_map, topk=1, capacity_factor=1.0)
    assert kept[:, 0].nonzero().flatten().tolist() == [1, 4] and kept[:, 2].nonzero().flatten().tolist() == [3]
    assert kept[:, 1].sum() == 0 and torch.equal(kept_probs, probs * kept)
    # Padded: every expert gets exactly its capacity, the extra rows weighted by 0.
    padded_probs, padded = apply_router_token_dropping(probs, routing_map, topk=1, capacity_factor=1.0,
                                                       pad_to_capacity=True)
    assert padded.sum(dim=0).tolist() == [2, 2, 2]
    assert torch.equal(padded_probs[kept], probs[kept]) and padded_probs[padded & ~kept].abs().sum() == 0
    # A capacity beyond the tokens drops nothing.
    assert torch.equal(apply_router_token_dropping(probs, routing_map, topk=1, capacity_factor=3.0)[1], routing_map)


def test_permute_groups_rows_by_expert_and_unpermute_brings_them_back():
    from minitron.core.transformer.moe.moe_utils import permute, unpermute

    torch.manual_seed(0)
    tokens = torch.randn(6, 3)
    logits = torch.randn(6, 4)
    top = logits.topk(2, dim=1)
    routing_map = torch.zeros(6, 4, dtype=torch.bool).scatter(1, top.indices, True)
    probs = torch.zeros(6, 4).scatter(1, top.indices, torch.softmax(top.values, dim=1))
    permuted, sorted_indices = permute(tokens, routing_map)
    assert permuted.shape == (12, 3)   # dropless: T * k rows
    expected = [t for e in range(4) for t in range(6) if routing_map[t, e]]
    assert sorted_indices.tolist() == expected
    assert torch.equal(permuted, tokens[expected])
    # Each token's two copies come back weighted by probabilities that sum to one.
    restored = unpermute(permuted, sorted_indices, probs, routing_map, tokens.shape)
    assert torch.allclose(restored, tokens, atol=1e-6)


def _dispatch_round_trip(rank):
    from minitron.core import parallel_state as ps
    from minitron.core.transformer.moe.token_dispatcher import MoEAlltoAllTokenDispatcher
    from minitron.core.transformer.transformer_config import TransformerConfig

    config = TransformerConfig(num_layers=1, hidden_size=4, num_attention_heads=1, num_moe_experts=4,
                               moe_router_topk=2, expert_model_parallel_size=2)
    ep_rank = ps.get_expert_model_parallel_rank()
    local = [2 * ep_rank, 2 * ep_rank + 1]
    dispatcher = MoEAlltoAllTokenDispatcher(2, local, config)
    torch.manual_seed(rank)
    hidden = torch.randn(5, 1, 4, requires_grad=True)   # [s, b, h]: a different sequence per rank
    top = torch.randn(5, 4).topk(2, dim=1)
    routing_map = torch.zeros(5, 4, dtype=torch.bool).scatter(1, top.indices, True)
    probs = torch.zeros(5, 4).scatter(1, top.indices, torch.softmax(top.values, dim=1))
    received, per_expert = dispatcher.token_permutation(hidden, probs, routing_map)
    output = dispatcher.token_unpermutation(received)   # identity experts
    output.sum().backward()
    counts = torch.tensor(routing_map.sum(0).tolist())
    everyone = [torch.zeros(4, dtype=torch.long) for _ in range(2)]
    torch.distributed.all_gather(everyone, counts.long())
    return {"home": torch.allclose(output, hidden, atol=1e-6), "per_expert": per_expert.tolist(),
            "expected": sum(everyone)[local].tolist(), "rows": received.shape[0],
            "grad": torch.allclose(hidden.grad, torch.ones_like(hidden))}


def test_all_to_all_dispatcher_round_trip(tmp_path):
    results = run_ranks(_dispatch_round_trip, world_size=2, ep=2, trace_dir=str(tmp_path))
    for result in results:
        assert result["home"] and result["grad"]
        assert result["per_expert"] == result["expected"]   # my experts got every token routed to them
        assert result["rows"] == sum(result["expected"])
    # The trace shows the exchanges on the expert-parallel group, with what left and what arrived:
    # dispatch, combine, and the combine's and the dispatch's gradients in backward.
    for rank, result in enumerate(results):
        records = [json.loads(line) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
        calls = [r["args"] for r in records if r["name"] == "torch.distributed.all_to_all_single"]
        assert len(calls) == 4 and all(c["group"] == "EXPERT_MODEL_PARALLEL_GROUP" for c in calls)
        dispatch, combine = calls[0], calls[1]
        assert dispatch["input_shape"] == [10, 4] and dispatch["shape"] == [result["rows"], 4]  # 5 tokens x top-2
        assert combine["output_split_sizes"] == dispatch["input_split_sizes"]   # every row comes home


def test_switch_load_balancing_loss_by_hand():
    from minitron.core.transformer.moe.moe_utils import MoEAuxLossAutoScaler, switch_load_balancing_loss_func

    # 3 tokens, 2 experts, top-1: tokens 0 and 2 choose expert 0, token 1 expert 1.
    scores = torch.tensor([[0.7, 0.3], [0.4, 0.6], [0.9, 0.1]])
    tokens_per_expert = torch.tensor([2.0, 1.0])
    # f = [2/3, 1/3], P = [2/3, 1/3]: E * sum f_i P_i = 2 * (4/9 + 1/9) = 10/9
    loss = switch_load_balancing_loss_func(scores, tokens_per_expert, total_num_tokens=3, topk=1,
                                           num_experts=2, moe_aux_loss_coeff=0.5)
    assert loss.item() == pytest.approx(0.5 * 10 / 9)
    # The autoscaler: identity forward; backward hands the aux loss the main loss's scale.
    x = torch.ones(3, requires_grad=True)
    aux = torch.tensor(2.0, requires_grad=True)
    MoEAuxLossAutoScaler.set_loss_scale(torch.tensor(0.25))
    try:
        MoEAuxLossAutoScaler.apply(x, aux * 3).sum().backward()
    finally:
        MoEAuxLossAutoScaler.main_loss_backward_scale = None
    assert x.grad.tolist() == [1.0, 1.0, 1.0] and aux.grad.item() == pytest.approx(0.75)


@pytest.mark.parametrize("flags, words", [
    (["--num-experts", "2", "--moe-router-topk", "3"], "--moe-router-topk 3 is more than --num-experts 2"),
    (["--num-experts", "4", "--tensor-model-parallel-size", "2", "--sequence-parallel",
      "--moe-ffn-hidden-size", "5"], "not divisible by --expert-tensor-parallel-size 2"),
    (["--num-experts", "4", "--moe-pad-expert-input-to-capacity"], "give --moe-expert-capacity-factor"),
    (["--num-experts", "4", "--moe-expert-capacity-factor", "0"], "capacity-factor: must be > 0, got 0"),
    (["--num-experts", "4", "--moe-expert-capacity-factor", "-1.5"], "capacity-factor: must be > 0, got -1.5"),
    (["--moe-expert-capacity-factor", "1.0"], "add --num-experts"),
])
def test_moe_refusals(flags, words):
    base = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
            "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data",
            "--distributed-backend", "gloo", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64"]
    with pytest.raises(ArgumentError, match=words):   # the parser refuses a factor <= 0 itself
        args = build_parser().parse_args(base + flags)
        args.world_size, args.rank = 4, 0
        validate_args(args)
