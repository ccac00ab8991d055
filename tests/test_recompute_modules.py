"""--recompute-modules (selective recomputation, Megatron's units): each module minitron recomputes
(core_attn, mlp, shared_experts) gives the plain run's loss and gradients bit for bit, dropout on,
and keeps fewer bytes for backward, counted by torch's saved-tensor hooks during the forward."""

from __future__ import annotations

import torch

from distributed import run_ranks
from minitron.core.models.gpt import GPTModel
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
from minitron.core.transformer import TransformerConfig

VOCAB, SEQ, BATCH = 64, 16, 2
DENSE = dict(num_layers=2, hidden_size=16, num_attention_heads=4, ffn_hidden_size=64)
MOE = dict(DENSE, num_moe_experts=2, moe_router_topk=1, moe_router_pre_softmax=True, add_bias_linear=False,
           moe_shared_expert_intermediate_size=64, moe_ffn_hidden_size=32)


def _run(shape: dict, modules: list[str] | None) -> dict:
    recompute = dict(recompute_granularity="selective", recompute_modules=modules) if modules else {}
    config = TransformerConfig(hidden_dropout=0.2, attention_dropout=0.2, init_seed=5, **shape, **recompute)
    model_parallel_cuda_manual_seed(11)
    model = GPTModel(config, VOCAB, SEQ)
    g = torch.Generator().manual_seed(7)
    ids, labels = (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(2))
    saved = []

    def pack(tensor):
        saved.append(tensor.numel() * tensor.element_size())
        return tensor
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(ids, torch.arange(SEQ).expand(BATCH, SEQ), labels=labels).mean()
    loss.backward()
    return {"loss": loss.detach(), "saved": sum(saved),
            "grads": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}}


def _body(rank):
    torch.set_num_threads(1)
    out = {}
    for shape_name, shape, variants in (("dense", DENSE, (["core_attn"], ["mlp"], ["core_attn", "mlp"])),
                                        ("moe", MOE, (["shared_experts"],))):
        plain = _run(shape, None)
        for modules in variants:
            other = _run(shape, modules)
            same = torch.equal(plain["loss"], other["loss"]) and plain["grads"].keys() == other["grads"].keys() \
                and all(torch.equal(plain["grads"][n], other["grads"][n]) for n in plain["grads"])
            out[shape_name, " ".join(modules)] = (same, plain["saved"], other["saved"])
    return out


def test_each_recomputed_module_keeps_the_numbers_and_fewer_bytes():
    (results,) = run_ranks(_body, world_size=1, tp=1)
    for name, (same, plain, recomputed) in results.items():
        assert same, f"{name}: loss or gradients differ from the plain run"
        assert recomputed < plain, f"{name}: {recomputed} saved bytes, plain {plain}"
    # the two modules' savings add up: each drops what only it kept
    dense = {k[1]: plain - recomputed for k, (_, plain, recomputed) in results.items() if k[0] == "dense"}
    assert dense["core_attn mlp"] == dense["core_attn"] + dense["mlp"]
