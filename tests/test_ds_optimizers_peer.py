"""test_ds_optimizers.py's optimizers held against the real DeepSpeed 0.19.8 on its CPU accelerator,
in the same forked gloo ranks: the same model, config and batches give the same losses and the
same weights (fp32, rel 1e-6; bf16, one bf16 step) for

* torch's SGD named by the config, at ZeRO 0-2 (1 and 2 only with zero_allow_untested_optimizer),
* an optimizer section with no "type" beside a client optimizer: DeepSpeed reads neither the
  section nor its params (its lr of 5.0 here would blow the run up if it were read).

FusedLamb is not here: DeepSpeed builds it for CUDA only (its FusedLambBuilder loads nowhere
else), so test_ds_optimizers.py holds it against the kernel's arithmetic instead.
"""
import os

import pytest
import torch

from distributed import run_ranks
from deepspeed_child import NEEDS_DEEPSPEED
from test_ds_checkpoint import TiedNet, train

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

SGD = {"type": "SGD", "params": {"lr": 0.05, "momentum": 0.9, "weight_decay": 0.01, "nesterov": True}}
CASES = {"sgd0": (0, "fp32", SGD), "sgd0_bf16": (0, "bf16", SGD), "sgd1": (1, "fp32", SGD), "sgd2": (2, "fp32", SGD),
         "typeless": (0, "fp32", {"params": {"lr": 5.0}})}


def _config(stage, precision, optimizer):
    config = {"train_batch_size": 4, "gradient_clipping": 1.0, "zero_optimization": {"stage": stage},
              "optimizer": optimizer, "zero_allow_untested_optimizer": True}
    if precision != "fp32":
        config[precision] = {"enabled": True}
    return config


def _both(rank):
    import deepspeed   # only in the ranks: the tests' parent process stays free of it
    from minitron.runtime import initialize
    out = {}
    for name, (stage, precision, optimizer) in CASES.items():
        for who, init in (("minitron", initialize), ("deepspeed", deepspeed.initialize)):
            model = TiedNet()
            client = torch.optim.SGD(model.parameters(), lr=0.02) if "type" not in optimizer else None
            engine, *_ = init(model=model, optimizer=client, config=_config(stage, precision, optimizer))
            losses = train(engine, rank, precision, range(3))
            out[name, who] = {"losses": losses, "weights": [p.detach().float().clone()
                                                            for p in engine.module.parameters()]}
    return out


@pytest.fixture(scope="module")
def both():
    return run_ranks(_both, world_size=2, tp=None)


@pytest.mark.parametrize("name", list(CASES))
def test_same_losses_and_weights_as_deepspeed(both, name):
    # bf16: a weight may land one bf16 step (2^-8 relative, ~1e-3 at these weights' size) apart
    rel, atol = (1e-6, 1e-8) if CASES[name][1] == "fp32" else (1e-2, 1e-3)
    for rank in (0, 1):
        mine, ds = both[rank][name, "minitron"], both[rank][name, "deepspeed"]
        assert mine["losses"] == pytest.approx(ds["losses"], rel=rel)
        for a, b in zip(mine["weights"], ds["weights"]):
            torch.testing.assert_close(a, b, rtol=rel, atol=atol)
