"""DeepSpeed's "Muon" optimizer (runtime/zero/muon/): the Newton-Schulz iteration's promise on
its own, a 2-rank engine run at stage 0, and the one-line refusals beyond stage 0 / fp32."""
import pytest
import torch

from distributed import run_ranks
from test_ds_checkpoint import TiedNet, train

from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError
from minitron.runtime.zero.muon.original_muon import (aspect_ratio_scale, muon_update,
                                                      zeropower_via_gram_newtonschulz, zeropower_via_newtonschulz5)

MUON = {"type": "Muon", "params": {"lr": 0.02, "adam_lr": 0.01, "weight_decay": 0.1}}


@pytest.mark.parametrize("method", [zeropower_via_gram_newtonschulz, zeropower_via_newtonschulz5])
@pytest.mark.parametrize("shape", [(16, 48), (48, 16), (32, 32)])
def test_newton_schulz_orthogonalises(method, shape):
    """X = NS(G) is G's U S' V^T: G's singular vectors, singular values pulled into a band round 1.
    Five rounds of Jordan's quintic leave them in about [0.7, 1.2] for a Gaussian G (his note),
    in fp16/bf16; the band asserted, [0.6, 1.3], adds half-precision rounding. The singular
    vectors are G's: U^T X V is diagonal up to the same rounding (off-diagonal <= 0.05)."""
    torch.manual_seed(0)
    G = torch.randn(shape)
    X = method(G).float()
    assert X.shape == G.shape
    s = torch.linalg.svdvals(X)
    assert s.min() > 0.6 and s.max() < 1.3, s
    U, _, Vh = torch.linalg.svd(G, full_matrices=False)
    inner = U.mT @ X @ Vh.mT
    off = inner - torch.diag_embed(inner.diagonal())
    assert off.abs().max() < 0.05
    # and the two forms agree with each other up to their dtypes' rounding (bf16: 2^-8 relative)
    other = (zeropower_via_newtonschulz5 if method is zeropower_via_gram_newtonschulz
             else zeropower_via_gram_newtonschulz)(G).float()
    torch.testing.assert_close(X, other, rtol=0, atol=0.05)


def test_muon_update_momentum_nesterov_and_overflow():
    """The momentum is m <- beta m + (1 - beta) g; an Inf gradient leaves it untouched and comes
    back as the update, so the loss scaler sees the overflow."""
    torch.manual_seed(1)
    g, m = torch.randn(8, 24), torch.randn(8, 24)
    expected_m = 0.95 * m + 0.05 * g
    nesterov = g + 0.95 * (expected_m - g)
    update = muon_update(g.clone(), m, beta=0.95, ns_method="standard")
    torch.testing.assert_close(m, expected_m)
    torch.testing.assert_close(update, zeropower_via_newtonschulz5(nesterov).float(), rtol=0, atol=1e-2)
    bad = g.clone()
    bad[0, 0] = float("inf")
    before = m.clone()
    assert not torch.isfinite(muon_update(bad, m)).all()
    assert torch.equal(m, before)
    assert aspect_ratio_scale(48, 16) == pytest.approx(3 ** 0.5) and aspect_ratio_scale(16, 48) == 1.0


def _run(rank):
    from minitron.runtime import initialize
    engine, *_ = initialize(model=TiedNet(), config={"train_batch_size": 4, "zero_optimization": {"stage": 0},
                                                     "optimizer": MUON})
    basic = engine.basic_optimizer
    groups = [(g["name"], g["use_muon"], g["lr"], g.get("betas"), g.get("momentum")) for g in basic.param_groups]
    return {"losses": train(engine, rank, "fp32", [0] * 4), "groups": groups,
            "tagged": {n: p.use_muon for n, p in engine.module.named_parameters()},
            "momentum": [k for s in basic.state.values() for k in s]}


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_run, world_size=2, tp=None)


def test_engine_tags_matrices_and_trains(ranks):
    r0 = ranks[0]
    # matrices to Muon, vectors to Adam (TiedNet has no "embed"/"lm_head" names)
    assert r0["tagged"] == {n: n.endswith("weight") and not n.startswith("norm") for n in r0["tagged"]}
    assert r0["groups"] == [("muon-params", True, 0.02, None, 0.95), ("adam-params", False, 0.01, (0.9, 0.95), None)]
    assert {"momentum_buffer", "exp_avg", "exp_avg_sq"} <= set(r0["momentum"])
    assert r0["losses"] == ranks[1]["losses"]   # all-reduced gradients: one model
    assert r0["losses"][-1] < r0["losses"][0]   # one batch four times: Muon fits it


@pytest.mark.parametrize("extra, says", [
    ({"zero_optimization": {"stage": 1}}, "stage 1 is not built"),
    ({"bf16": {"enabled": True}}, "with bf16 is not built"),
    ({"optimizer": {"type": "muon", "params": {"momentun": 0.9}}}, "['momentun'] for Muon"),
    ({"optimizer": {"type": "Muon", "params": {"ns_method": "svd"}}}, "ns_method 'svd' for Muon"),
])
def test_refusals(extra, says):
    with pytest.raises(DeepSpeedConfigError, match=None) as error:
        DeepSpeedConfig({"train_batch_size": 4, "optimizer": MUON, **extra})
    assert says in str(error.value)
