"""Multi-latent attention: tensor parallelism gives the serial numbers, and pretrain trains it.

At tp 2 every rank's weights must be its slice of the serial model's (both down projections
are column-parallel too, as in Megatron's local spec), the loss the serial loss and every
gradient its slice of the serial gradient. The gradient of the shared rope key k_pe is the one
a plain port gets wrong: each rank's heads see it, so its gradient is a sum over ranks
(multi_latent_attention.py). The latent norms are the opposite case: every rank normalises the
whole latent, so finalize_model_grads must not sum their gradients over TP (except as
sequence-parallel norms). Both run with and without sequence parallelism, q compression on.
"""

from __future__ import annotations

import torch

from distributed import pretrain_records, rope_gpt_loss_backward, run_ranks, tp_shard
from minitron.core import parallel_state
from minitron.core.transformer import TransformerConfig

VOCAB, SEQ, BATCH, TOL = 64, 8, 2, 1e-5
MLA = dict(multi_latent_attention=True, q_lora_rank=6, kv_lora_rank=8, qk_head_dim=4, qk_pos_emb_head_dim=4,
           v_head_dim=6, qk_layernorm=True, normalization="RMSNorm")


def _runs(tp: int):
    def body(rank):
        # In the rank, not at the top: importing the submodule in pytest's process would make the
        # package's attribute finalize_model_grads the module, hiding its lazily loaded function.
        from minitron.core.distributed.finalize_model_grads import _allreduce_layernorm_grads
        torch.set_num_threads(1)
        out = {}
        for sp in (True, False):
            config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=4, ffn_hidden_size=32,
                                       hidden_dropout=0.0, attention_dropout=0.0, init_seed=3, init_method_std=0.3,
                                       tensor_model_parallel_size=tp, sequence_parallel=sp, **MLA)
            model, loss = rope_gpt_loss_backward(config, VOCAB, SEQ, BATCH)
            _allreduce_layernorm_grads([model], config)   # finalize_model_grads' sums over TP, by its rule
            params = dict(model.named_parameters())
            if tp == 1:
                out[sp] = {"loss": loss.detach(), "weights": {n: p.detach() for n, p in params.items()},
                           "grads": {n: p.grad for n, p in params.items()}}
                continue
            r, serial = parallel_state.get_tensor_model_parallel_rank(), _runs.serial[sp]
            out[sp] = {"loss": (loss.detach() - serial["loss"]).abs().max().item(),
                       "exact": all(torch.equal(p.detach(), tp_shard(serial["weights"][n], p, r, tp))
                                    for n, p in params.items()),
                       "grad": {n: (p.grad - tp_shard(serial["grads"][n], p, r, tp)).abs().max().item()
                                for n, p in params.items()}}
        return out
    return run_ranks(body, world_size=tp, tp=tp)


def test_mla_at_tp2_with_and_without_sequence_parallelism_equals_serial():
    _runs.serial = _runs(1)[0]
    results = _runs(2)   # the forked ranks inherit _runs.serial
    for sp in (True, False):
        assert all(r[sp]["exact"] for r in results), f"sp {sp}: weights are not the serial weights' slices"
        loss = max(r[sp]["loss"] for r in results)
        worst = max((g, n) for r in results for n, g in r[sp]["grad"].items())
        assert loss < TOL and worst[0] < TOL, \
            f"sp {sp}: loss off by {loss:.1e}; gradient of {worst[1]} off by {worst[0]:.1e}"


def test_pretrain_trains_a_small_mla_model(tmp_path):
    argv = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "4", "--seq-length", "16",
            "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4", "--lr", "1e-2", "--mock-data",
            "--vocab-size", "127", "--make-vocab-size-divisible-by", "64", "--eval-iters", "0",
            "--distributed-backend", "gloo", "--tensor-model-parallel-size", "2", "--multi-latent-attention",
            "--rope-type", "rope", "--q-lora-rank", "8", "--kv-lora-rank", "8", "--qk-head-dim", "4",
            "--qk-pos-emb-head-dim", "4", "--v-head-dim", "4", "--qk-layernorm", "--normalization", "RMSNorm",
            "--position-embedding-type", "rope"]
    losses = [record["lm_loss"] for record in pretrain_records(tmp_path / "run", 2, argv)]
    assert len(losses) == 4 and all(loss == loss for loss in losses), losses
    assert losses[-1] < losses[0], f"four steps of MLA did not lower the loss: {losses}"
