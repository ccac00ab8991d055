"""YaRN rope: a GPT with --position-embedding-type yarn at tp 2 (with sequence parallelism) gives
the serial loss and gradients, and the command line reaches the config as Megatron's does.

Tensor parallelism splits heads and every head turns by the same angles, so nothing should
differ; what could is the concentration factor (each rank's attention must apply it) and the
angles of the whole sequence under sequence parallelism. MLA's YaRN at tp 2 is test_mla's case
(its default rope type is yarn); Megatron-Core's numbers are test_mcore_yarn's.
"""

from __future__ import annotations

import torch

from distributed import run_ranks, tp_shard
from minitron.core import parallel_state
from minitron.core.models.gpt import GPTModel
from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
from minitron.core.transformer import TransformerConfig

VOCAB, SEQ, BATCH, TOL = 64, 16, 2, 1e-5
# A context of 4 stretched 4 times: the 16 positions reach past it, and mscale is 1 + 0.1 ln 4.
YARN = dict(yarn_rotary_scaling_factor=4.0, yarn_original_max_position_embeddings=4, yarn_beta_fast=4.0,
            yarn_beta_slow=0.5)


def _run(tp: int):
    def body(rank):
        from minitron.core.distributed.finalize_model_grads import _allreduce_layernorm_grads  # as test_mla
        torch.set_num_threads(1)
        config = TransformerConfig(num_layers=2, hidden_size=32, num_attention_heads=4, ffn_hidden_size=64,
                                   hidden_dropout=0.0, attention_dropout=0.0, init_seed=3, init_method_std=0.3,
                                   tensor_model_parallel_size=tp, sequence_parallel=tp > 1, **YARN)
        model_parallel_cuda_manual_seed(5)
        model = GPTModel(config, VOCAB, SEQ, position_embedding_type="yarn")
        g = torch.Generator().manual_seed(1)
        ids, labels = (torch.randint(0, VOCAB, (BATCH, SEQ), generator=g) for _ in range(2))
        loss = model(ids, torch.arange(SEQ).expand(BATCH, SEQ), labels=labels)
        loss.mean().backward()
        _allreduce_layernorm_grads([model], config)   # sequence-parallel norms: finalize_model_grads' sum
        params = dict(model.named_parameters())
        if tp == 1:
            return {"loss": loss.detach(), "grads": {n: p.grad for n, p in params.items()},
                    "mscale": model.decoder.layers[0].self_attention._yarn_concentration_factor}
        r, serial = parallel_state.get_tensor_model_parallel_rank(), _run.serial
        return {"loss": (loss.detach() - serial["loss"]).abs().max().item(),
                "grad": max((p.grad - tp_shard(serial["grads"][n], p, r, tp)).abs().max().item()
                            for n, p in params.items())}
    return run_ranks(body, world_size=tp, tp=tp)


def test_yarn_gpt_at_tp2_with_sequence_parallelism_equals_serial():
    _run.serial = _run(1)[0]
    assert abs(_run.serial["mscale"] - 1.1386294) < 1e-6   # 1 + 0.1 ln 4: the factor is on
    for r in _run(2):
        assert r["loss"] < TOL and r["grad"] < TOL, r


def test_yarn_flags_reach_the_config_as_megatrons_do():
    from minitron.training.arguments import core_transformer_config_from_args, parse_args, validate_args

    base = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "16",
            "--max-position-embeddings", "16", "--micro-batch-size", "1", "--vocab-size", "64"]

    def config(*flags):
        args = parse_args(argv=base + list(flags))
        validate_args(args)
        return core_transformer_config_from_args(args)
    gpt = config("--position-embedding-type", "yarn", "--rotary-scaling-factor", "8", "--yarn-beta-fast", "16",
                 "--no-yarn-correction-range-round-to-int")
    assert (gpt.yarn_rotary_scaling_factor, gpt.yarn_beta_fast, gpt.yarn_beta_slow,
            gpt.yarn_correction_range_round_to_int) == (8.0, 16.0, 1.0, False)
    # a rope GPT keeps the factor out of its attention, whatever --rotary-scaling-factor says
    assert config("--position-embedding-type", "rope", "--rotary-scaling-factor", "8").yarn_rotary_scaling_factor == 1.0
    # MLA without --rope-type rotates with YaRN (Megatron's default), scaled by the flags
    mla = config("--position-embedding-type", "rope", "--multi-latent-attention", "--qk-pos-emb-head-dim", "4",
                 "--rotary-scaling-factor", "40", "--mscale-all-dim", "0.7")
    assert (mla.rope_type, mla.rotary_scaling_factor, mla.mscale_all_dim, mla.beta_fast) == ("yarn", 40.0, 0.7, 32)
