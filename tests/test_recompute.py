"""Activation recomputation changes memory, never numbers: with dropout ON, a recomputed run
gives the loss and every gradient of the plain run bit for bit.

That holds only if the recomputed forward draws the very dropout masks of the first forward,
on the default stream (hidden dropout, replicated across TP) and on the model-parallel stream
(attention dropout on each rank's heads; everything under sequence parallelism), which is what
tensor_parallel.checkpoint's RNG bookkeeping is for. Two iterations run back to back, so the
second also checks that recomputing left the generators where the plain run has them.
"""

from __future__ import annotations

import pytest
import torch

from distributed import run_ranks
from minitron.core.models.gpt import GPTModel
from minitron.core.tensor_parallel import checkpoint, get_cuda_rng_tracker, model_parallel_cuda_manual_seed
from minitron.core.transformer import TransformerConfig

VOCAB, SEQ, BATCH = 64, 8, 2
VARIANTS = {
    "none": {},
    "full-uniform-1": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1),
    "full-uniform-2": dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=2),
    "full-block-2": dict(recompute_granularity="full", recompute_method="block", recompute_num_layers=2),
    "selective": dict(recompute_granularity="selective"),
}


def _run(tp: int, sp: bool, recompute: dict) -> dict:
    config = TransformerConfig(num_layers=3, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32,
                               hidden_dropout=0.2, attention_dropout=0.2, tensor_model_parallel_size=tp,
                               sequence_parallel=sp, init_seed=5, **recompute)
    model_parallel_cuda_manual_seed(11)
    model = GPTModel(config, VOCAB, SEQ)
    g = torch.Generator().manual_seed(7)
    losses = []
    for _ in range(2):
        ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
        loss = model(ids, torch.arange(SEQ).expand(BATCH, SEQ), labels=labels).mean()
        loss.backward()
        losses.append(loss.detach())
    model.eval()
    with torch.no_grad():   # the same batch without dropout: proves the dropout was really on
        no_dropout = model(ids, torch.arange(SEQ).expand(BATCH, SEQ), labels=labels).mean()
    return {"losses": losses, "no_dropout": no_dropout, "after": torch.rand(3),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters()}}


def _compare(tp: int, sps: tuple[bool, ...]):
    def body(rank):
        torch.set_num_threads(1)
        results = {}
        for sp in sps:
            plain = _run(tp, sp, {})
            diffs = {}
            for name, recompute in VARIANTS.items():
                other = _run(tp, sp, recompute)
                diffs[name] = [n for n in plain["grads"] if not torch.equal(plain["grads"][n], other["grads"][n])]
                if not all(torch.equal(a, b) for a, b in zip(plain["losses"], other["losses"])):
                    diffs[name].append("loss")
                if not torch.equal(plain["after"], other["after"]):
                    diffs[name].append("rng after")
            results[sp] = {"diffs": diffs, "dropout_on": not torch.equal(plain["losses"][1], plain["no_dropout"])}
        return results
    return run_ranks(body, world_size=tp, tp=tp)


@pytest.mark.parametrize("tp,sps", [(1, (False,)), (2, (False, True))], ids=["tp1", "tp2-and-tp2-sp"])
def test_recomputed_run_equals_plain_run_bit_for_bit(tp, sps):
    for rank, per_sp in enumerate(_compare(tp, sps)):
        for sp, result in per_sp.items():
            assert result["dropout_on"]
            assert result["diffs"] == {name: [] for name in VARIANTS}, f"rank {rank} sp={sp}: {result['diffs']}"


def test_checkpoint_replays_the_dropout_masks_of_the_first_forward():
    """The unit underneath: forward under checkpoint, backward recomputes with the same masks;
    a recompute that drew fresh masks (plain torch state, no restore) would give other grads."""
    def body(rank):
        torch.set_num_threads(1)
        x = torch.randn(6, 5, generator=torch.Generator().manual_seed(0))

        def f(t):
            with get_cuda_rng_tracker().fork():
                t = torch.nn.functional.dropout(t, 0.5)
            return torch.nn.functional.dropout(t * 3, 0.5)

        grads = []
        for use_checkpoint in (False, True):
            model_parallel_cuda_manual_seed(3)
            leaf = x.clone().requires_grad_()
            out = checkpoint(f, False, leaf) if use_checkpoint else f(leaf)
            out.sum().backward()
            grads.append((out.detach(), leaf.grad, torch.rand(2)))
        (o1, g1, r1), (o2, g2, r2) = grads
        return torch.equal(o1, o2) and torch.equal(g1, g2) and torch.equal(r1, r2) and bool((g1 == 0).any())
    assert run_ranks(body, world_size=1) == [True]
