"""Latent MoE (--moe-latent-size, Nemotron-3 Super and Ultra): the routed experts work in L < h.

1. pretrain_gpt on forked gloo ranks, test_moe.py's 4-expert top-2 model made latent (L = 8 of
   h's 16) with a shared expert: per-iteration lm loss and load-balancing loss within 1e-5 of the
   serial run at tp 2 x ep 2 with sequence parallelism, where each tensor-parallel rank projects
   only its part of the sequence and the projections' gradients are summed over tp (their
   sequence_parallel mark), and the dispatched rows are L wide.
2. The estimate's parameter count, closed form: each MoE layer gains two h x L projections, and
   every expert's fc1 and fc2 are L wide instead of h.
(Megatron-Core's own latent MoE layer, weight for weight: tests/test_mcore_moe_latent.py.)
"""

import pytest
from test_moe import EP, ITERS, run

LATENT = ["--moe-latent-size", "8", "--moe-shared-expert-intermediate-size", "16", "--disable-bias-linear"]
TP2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]


def test_latent_moe_tp2_ep2_matches_serial(tmp_path):
    serial_losses, serial_balance = run(tmp_path / "serial", "serial", 1, *LATENT)
    losses, balance = run(tmp_path / "tp2ep2", "tp2-ep2", 4, *LATENT, *EP, *TP2)
    assert len(losses) == ITERS and losses[-1] != losses[0]   # trained, and the weights moved
    assert losses == pytest.approx(serial_losses, abs=1e-5), f"{losses} vs serial {serial_losses}"
    assert balance == pytest.approx(serial_balance, abs=1e-5), f"{balance} vs serial {serial_balance}"


def test_latent_params_against_closed_form():
    from test_estimate import estimate_args

    from minitron.training import theoretical_memory_usage as tmu

    h, latent, ffn, e, layers = 64, 16, 256, 8, 4
    flags = ["--num-layers", str(layers), "--hidden-size", str(h), "--ffn-hidden-size", str(ffn),
             "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "1000", "--micro-batch-size", "1",
             "--num-experts", str(e), "--disable-bias-linear"]
    plain = tmu.total_params(estimate_args(1, *flags))
    small = tmu.total_params(estimate_args(1, "--moe-latent-size", str(latent), *flags))
    assert plain - small == layers * (e * 2 * ffn * (h - latent) - 2 * h * latent)
