"""The modern GPT options keep tensor parallelism exact: each at tp 2 trains like the serial model.

rope, swiglu, RMSNorm, grouped-query attention and an untied output layer each change where a
tensor-parallel rank's slice boundaries fall (swiglu's [gate | up] halves, GQA's [q.. k v]
groups) or which reductions run (untied: no embedding-group all-reduce; qk-layernorm: its
per-head norms' gradients summed over TP). No linear biases, the norms' epsilon and the
zero-centred (1 + weight) norms change the math each rank does on its slice. Dropout is off, the
initial weights do not depend on the layout (init_seed), and every option must give the serial
run's loss at every iteration within 1e-5:

1. each option alone: the model trained for a few SGD steps on 1 rank and on 2 TP ranks;
2. all options together, through `pretrain_gpt` and its flags: serial, tp 2 with sequence
   parallelism, and pp 2 (where the untied output layer lives on another stage than the
   embedding and finalize_model_grads must not all-reduce the two).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from distributed import pretrain_records, run_ranks
from minitron.core import parallel_state
from minitron.core.models.gpt import GPTModel
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
from minitron.core.transformer import TransformerConfig

VOCAB, SEQ, BATCH, STEPS, TOL = 64, 8, 2, 3, 1e-5
OPTIONS = {  # name: (TransformerConfig fields, GPTModel arguments)
    "rope": ({}, dict(position_embedding_type="rope")),
    "swiglu": (dict(gated_linear_unit=True, activation_func=F.silu), {}),
    "rmsnorm": (dict(normalization="RMSNorm"), {}),
    "gqa": (dict(num_query_groups=2), {}),
    "untied": ({}, dict(share_embeddings_and_output_weights=False)),
    "no-bias": (dict(add_bias_linear=False), {}),
    "qk-layernorm": (dict(qk_layernorm=True), {}),          # its gradient is partial over TP
    "norm-epsilon": (dict(layernorm_epsilon=0.5), {}),       # large enough to move the loss
    "layernorm-1p": (dict(layernorm_zero_centered_gamma=True), {}),
    "rmsnorm-1p": (dict(layernorm_zero_centered_gamma=True, normalization="RMSNorm"), {}),
}


def _sum_qk_norm_grads(model):
    """What finalize_model_grads does for --qk-layernorm (this loop trains the bare model): each
    TP rank normalised only its own heads, so the shared per-head norms' gradients are partial."""
    for name, param in model.named_parameters():
        if "q_layernorm" in name or "k_layernorm" in name:
            torch.distributed.all_reduce(param.grad, group=parallel_state.get_tensor_model_parallel_group())


def _train_each_option(tp: int):
    def body(rank):
        torch.set_num_threads(1)
        losses, norms = {}, {}
        for name, (fields, model_args) in OPTIONS.items():
            config = TransformerConfig(num_layers=2, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32,
                                       hidden_dropout=0.0, attention_dropout=0.0, init_seed=3,
                                       tensor_model_parallel_size=tp, **fields)
            model_parallel_cuda_manual_seed(5)
            model = GPTModel(config, VOCAB, SEQ, **{"share_embeddings_and_output_weights": True, **model_args})
            opt = torch.optim.SGD(model.parameters(), lr=0.5)   # elementwise: slices update as the whole
            g = torch.Generator().manual_seed(1)
            losses[name] = []
            for _ in range(STEPS):
                ids, labels = (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(2))
                loss = model(ids, torch.arange(SEQ).expand(BATCH, SEQ), labels=labels).mean()
                opt.zero_grad()
                loss.backward()
                _sum_qk_norm_grads(model)
                opt.step()
                losses[name].append(loss.item())
            # The norms are whole on every rank: their trained values must match the serial ones
            # too (a partial gradient moves the loss too little to see within three steps).
            norms[name] = {n: p.detach().clone() for n, p in model.named_parameters() if "layernorm" in n}
        return losses, norms
    return run_ranks(body, world_size=tp, tp=tp)


def test_each_option_at_tp2_trains_like_serial():
    serial, serial_norms = _train_each_option(1)[0]
    tp2 = _train_each_option(2)
    for name in OPTIONS:
        assert serial[name][0] != serial[name][-1]                      # the weights did move
        for rank, norms in tp2:
            assert rank[name] == pytest.approx(serial[name], abs=TOL), f"{name}: {rank[name]} vs {serial[name]}"
            for n, value in norms[name].items():
                assert torch.allclose(value, serial_norms[name][n], atol=TOL), f"{name}: {n} differs from serial"


ALL_OPTIONS = ["--position-embedding-type", "rope", "--swiglu", "--normalization", "RMSNorm",
               "--group-query-attention", "--num-query-groups", "2", "--untie-embeddings-and-output-weights",
               "--disable-bias-linear", "--qk-layernorm", "--norm-epsilon", "1e-6", "--apply-layernorm-1p",
               "--window-size", "4,0", "--window-attn-skip-freq", "2"]   # layer 1 windowed, layer 2 full
MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "3", "--lr", "1e-2",
         "--mock-data", "--vocab-size", "127", "--make-vocab-size-divisible-by", "64",   # 128 rows at tp 1 and 2
         "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7", "--eval-iters", "0",
         "--distributed-backend", "gloo", *ALL_OPTIONS]


def _pretrain(tmp_path, name, world, *flags):
    return [record["lm_loss"] for record in pretrain_records(tmp_path / name, world, [*MODEL, *flags])]


def test_all_options_together_at_tp2_and_pp2_train_like_serial(tmp_path):
    serial = _pretrain(tmp_path, "serial", 1)
    assert len(serial) == 3 and serial[0] != serial[-1]
    for name, world, flags in [("tp2-sp", 2, ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
                               ("pp2", 2, ["--pipeline-model-parallel-size", "2"])]:
        losses = _pretrain(tmp_path, name, world, *flags)
        assert losses == pytest.approx(serial, abs=TOL), f"{name}: {losses} vs serial {serial}"
