"""A small GPT on TP ranks computes what the serial model computes, gradient by gradient.

1. Serial (world 1): GPTModel's loss and gradients equal an independent plain-torch GPT's
   ([b, s, h] layout, F.linear / F.layer_norm / explicit attention) on the same weights.
2. TP in {2, 4}, sequence parallelism off and on: the weights are exactly the serial weights'
   slices, the loss equals the serial loss, and each gradient equals its slice of the
   serial gradient. Dropout is off: with it on, TP ranks draw different masks by design.
"""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from distributed import run_ranks
from minitron.core import parallel_state
from minitron.core.models.gpt import GPTModel
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
from minitron.core.transformer import TransformerConfig

SIZES = dict(num_layers=2, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32)
VOCAB, SEQ, BATCH, SEED = 64, 8, 2, 1234
LOSS_TOL, GRAD_TOL = 1e-5, 1e-5


def build(tp: int, sp: bool, tied: bool):
    config = TransformerConfig(**SIZES, hidden_dropout=0.0, attention_dropout=0.0,
                               tensor_model_parallel_size=tp, sequence_parallel=sp)
    model_parallel_cuda_manual_seed(SEED)
    return GPTModel(config, VOCAB, SEQ, share_embeddings_and_output_weights=tied)


def batch():
    g = torch.Generator().manual_seed(7)
    ids = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return ids, torch.arange(SEQ).expand(BATCH, SEQ), labels


def reference_loss(W: dict, ids, positions, labels, tied: bool):
    """A plain GPT in [b, s, h] layout, written without any minitron code."""
    H, n, L = SIZES["hidden_size"], SIZES["num_attention_heads"], SIZES["num_layers"]
    d, (b, s) = H // n, ids.shape
    ln = lambda x, key: F.layer_norm(x, (H,), W[key + ".weight"], W[key + ".bias"], 1e-5)
    x = W["embedding.word_embeddings.weight"][ids] + W["embedding.position_embeddings.weight"][positions]
    causal = torch.ones(s, s, dtype=torch.bool).triu(1)
    for i in range(L):
        p = f"decoder.layers.{i}."
        qkv = F.linear(ln(x, p + "input_layernorm"), W[p + "self_attention.linear_qkv.weight"],
                       W[p + "self_attention.linear_qkv.bias"]).view(b, s, n, 3, d)
        q, k, v = (t.transpose(1, 2) for t in qkv.unbind(3))               # [b, n, s, d]
        scores = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(causal, float("-inf"))
        context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, s, H)
        x = x + F.linear(context, W[p + "self_attention.linear_proj.weight"], W[p + "self_attention.linear_proj.bias"])
        h = F.gelu(F.linear(ln(x, p + "pre_mlp_layernorm"), W[p + "mlp.linear_fc1.weight"], W[p + "mlp.linear_fc1.bias"]))
        x = x + F.linear(h, W[p + "mlp.linear_fc2.weight"], W[p + "mlp.linear_fc2.bias"])
    out = W["embedding.word_embeddings.weight"] if tied else W["output_layer.weight"]
    logits = ln(x, "decoder.final_layernorm") @ out.t()
    return F.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), reduction="none").view(b, s)


def serial_run() -> dict:
    """The serial model, tied and untied, in one forked rank: {tied: its loss, weights, grads}."""
    def body(rank):
        # A lone forked rank would get both cores and use torch's OpenMP pool, which deadlocks in
        # a child if an earlier test already started that pool in the pytest process. One thread.
        torch.set_num_threads(1)
        runs = {}
        for tied in (True, False):
            model = build(1, False, tied)
            ids, positions, labels = batch()
            loss = model(ids, positions, labels=labels)
            loss.mean().backward()
            W = {n: p.detach().clone().requires_grad_() for n, p in model.named_parameters()}
            ref = reference_loss(W, ids, positions, labels, tied)
            ref.mean().backward()
            diffs = {"loss": (loss - ref).abs().max().item()}
            diffs.update({n: (p.grad - W[n].grad).abs().max().item() for n, p in model.named_parameters()})
            runs[tied] = {"loss": loss.detach(), "diffs": diffs,
                          "weights": {n: p.detach() for n, p in model.named_parameters()},
                          "grads": {n: p.grad for n, p in model.named_parameters()}}
        return runs
    return run_ranks(body, world_size=1)[0]


@pytest.fixture(scope="module")
def serial():
    return serial_run()


def test_serial_model_matches_a_plain_torch_gpt(serial):
    diffs = serial[True]["diffs"]
    print(f"\nserial GPTModel vs plain torch: loss {diffs['loss']:.2e}, "
          f"max grad {max(v for k, v in diffs.items() if k != 'loss'):.2e}")
    assert all(v < 1e-5 for v in diffs.values()), diffs


def _shard(full: torch.Tensor, param, rank: int, tp: int) -> torch.Tensor:
    if getattr(param, "tensor_model_parallel", False):
        return full.chunk(tp, dim=param.partition_dim)[rank]
    return full


# (sp, tied) variants per tensor-parallel size; each size's variants run in one launch, one after
# another on the same ranks (build() reseeds, so each model starts as a fresh run's would).
VARIANTS = {2: [(False, True), (True, True), (True, False)], 4: [(False, True), (True, True)]}


def tp_run(tp: int, serial: dict) -> dict:
    """{(sp, tied): per rank, the loss and gradient differences from the serial model's slices}."""
    def one(sp: bool, tied: bool) -> dict:
        reference = serial[tied]
        model = build(tp, sp, tied)
        r = parallel_state.get_tensor_model_parallel_rank()
        ids, positions, labels = batch()
        loss = model(ids, positions, labels=labels)
        loss.mean().backward()
        for p in model.parameters():
            # What finalize_model_grads does under sequence parallelism: a replicated parameter
            # used on a part of the sequence has a partial gradient; sum it over the TP group.
            if getattr(p, "sequence_parallel", False):
                torch.distributed.all_reduce(p.grad, group=parallel_state.get_tensor_model_parallel_group())
        exact = all(torch.equal(p.detach(), _shard(reference["weights"][n], p, r, tp))
                    for n, p in model.named_parameters())
        grad_diff = {n: (p.grad - _shard(reference["grads"][n], p, r, tp)).abs().max().item()
                     for n, p in model.named_parameters()}
        names = sorted(n for n, _ in model.named_parameters())
        return {"loss_diff": (loss.detach() - reference["loss"]).abs().max().item(),
                "grad_diff": grad_diff, "weights_exact": exact, "names": names}

    ranks = run_ranks(lambda rank: {v: one(*v) for v in VARIANTS[tp]}, world_size=tp, tp=tp)
    return {v: [r[v] for r in ranks] for v in VARIANTS[tp]}


@pytest.fixture(scope="module")
def tp_runs(serial):
    return {}   # tp -> tp_run's answer, filled by the first test that needs it


def _results(tp_runs, serial, tp, sp, tied):
    if tp not in tp_runs:
        tp_runs[tp] = tp_run(tp, serial)
    return tp_runs[tp][(sp, tied)]


@pytest.mark.parametrize("tp,sp", [(2, False), (2, True), (4, False), (4, True)])
def test_tensor_parallel_gpt_equals_serial(serial, tp_runs, tp, sp):
    results = _results(tp_runs, serial, tp, sp, True)
    assert results[0]["names"] == sorted(serial[True]["weights"])  # same parameters, same names
    loss_diff = max(r["loss_diff"] for r in results)
    grad_diff = max(max(r["grad_diff"].values()) for r in results)
    print(f"\ntp={tp} sp={sp}: max |loss - serial| {loss_diff:.2e}, max |grad - serial slice| {grad_diff:.2e}")
    assert all(r["weights_exact"] for r in results), "TP weight slices differ from the serial weights"
    assert loss_diff < LOSS_TOL
    for r in results:
        bad = {n: v for n, v in r["grad_diff"].items() if v >= GRAD_TOL}
        assert not bad, bad


def test_untied_output_layer_equals_serial(serial, tp_runs):
    assert max(serial[False]["diffs"].values()) < 1e-5
    results = _results(tp_runs, serial, 2, True, False)
    assert "output_layer.weight" in results[0]["names"]
    assert all(r["weights_exact"] for r in results)
    assert max(r["loss_diff"] for r in results) < LOSS_TOL
    assert max(max(r["grad_diff"].values()) for r in results) < GRAD_TOL
