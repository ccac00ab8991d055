"""test_ds_engine_switches.py's numeric switches held against the real DeepSpeed 0.19.8's engine,
on its CPU accelerator, in the same forked gloo ranks (dp 2): the same model, config and batches
leave the same weights in both engines for

* gradient_allreduce_op "sum" after one SGD step, at ZeRO stages 0 and 2 (and "mean" beside it,
  so the test also sees the sum's step be twice the mean's in DeepSpeed itself),
* managed_gradient_accumulation false: two backward() calls, then one step() (the boundary), at
  stages 0, 1 and 2, with gradient_accumulation_steps 2 (each loss still divided by it),
* AdamW with bias_correction false (DeepSpeed's FusedAdam, CPU build; minitron's FusedAdam),
  two steps at stage 0 - and true beside it, which must land elsewhere.

Tolerance: fp32 throughout, the same operations on the same numbers. SGD: DeepSpeed all-reduces
each tensor where minitron all-reduces one flat buffer; rtol 1e-6, atol 1e-8. Adam: DeepSpeed's
CPU kernel fuses its multiply-adds (AVX FMA) and rounds its step size in float32, minitron's runs
torch's ops one by one; the two AdamWs alone, on the same weights and gradients, differ by up to
4 ulps of the largest weight (5e-7 at weights near 2): atol 1e-6.
"""
import os

import pytest
import torch

from deepspeed_child import NEEDS_DEEPSPEED
from distributed import run_ranks
from test_ds_checkpoint import TiedNet, batch

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

SGD = {"type": "SGD", "params": {"lr": 0.1}}
ADAMW = {"type": "AdamW", "params": {"lr": 0.01, "weight_decay": 0.01}}
CASES = {   # name: (zero stage, gradient_accumulation_steps, optimizer, other keys, backward calls, steps after)
    **{f"mean{s}": (s, 1, SGD, {}, 1, (0,)) for s in (0, 2)},
    **{f"sum{s}": (s, 1, SGD, {"gradient_allreduce_op": "sum"}, 1, (0,)) for s in (0, 2)},
    **{f"unmanaged{s}": (s, 2, SGD, {"managed_gradient_accumulation": False}, 2, (1,)) for s in (0, 1, 2)},
    "adamw_bias": (0, 1, ADAMW, {}, 2, (0, 1)),
    "adamw_nobias": (0, 1, {**ADAMW, "params": {**ADAMW["params"], "bias_correction": False}}, {}, 2, (0, 1)),
}


def _config(stage, gas, optimizer, extra):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas, "optimizer": optimizer,
            "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True, **extra}


def _both(rank):
    import deepspeed   # only in the ranks: the tests' parent process stays free of it
    from minitron.runtime import initialize

    torch.set_num_threads(1)
    out = {}
    for name, (stage, gas, optimizer, extra, backwards, steps_after) in CASES.items():
        for who, init in (("minitron", initialize), ("deepspeed", deepspeed.initialize)):
            engine, *_ = init(model=TiedNet(), config=_config(stage, gas, optimizer, extra))
            for i in range(backwards):
                x, y = batch(i, rank, "fp32")
                engine.backward(torch.nn.functional.mse_loss(engine(x), y))
                if i in steps_after:
                    engine.step()
            out[f"{who}|{name}"] = torch.cat([p.detach().reshape(-1).clone() for p in engine.module.parameters()])
    out["start"] = torch.cat([p.detach().reshape(-1) for p in TiedNet().parameters()])
    return out


@pytest.fixture(scope="module")
def both():
    return run_ranks(_both, world_size=2, tp=None)


@pytest.mark.parametrize("name", list(CASES))
def test_same_weights_as_deepspeed(both, name):
    atol = 1e-6 if name.startswith("adamw") else 1e-8
    for rank in (0, 1):
        torch.testing.assert_close(both[rank][f"minitron|{name}"], both[rank][f"deepspeed|{name}"],
                                   rtol=1e-6, atol=atol)


def test_the_switches_change_the_weights(both):
    got = both[0]
    for stage in (0, 2):   # in DeepSpeed itself: the sum's SGD step is dp = 2 times the mean's
        mean_step = got["start"] - got[f"deepspeed|mean{stage}"]
        torch.testing.assert_close(got["start"] - got[f"deepspeed|sum{stage}"], 2 * mean_step, rtol=1e-5, atol=1e-6)
    # without bias correction Adam's first steps are not lr-sized: the weights land elsewhere
    assert (got["deepspeed|adamw_bias"] - got["deepspeed|adamw_nobias"]).abs().max() > 1e-3
