"""test_ds_torch_autocast.py's section held against the real DeepSpeed 0.19.8's engine, on its CPU
accelerator, in the same forked gloo ranks (dp 2): with torch_autocast bfloat16 over an fp32
model, the same batches give the same losses and weights after three SGD steps in both engines,
at ZeRO stages 0, 1 and 2. The TiedNet's Linear layers compute in bf16 and (stages 1-2) reduce
their gradients in bf16, its LayerNorm in fp32: two buckets per reduction.

Tolerance: both run the same bf16 matmuls and the same bf16 sums on the wire (dp 2: the mean's
division by 2 is exact whether it comes before or after the cast, where DeepSpeed and minitron
differ); DeepSpeed reduces each tensor or bucket where minitron reduces flat pieces, so fp32
weights may differ by ulps: rtol 1e-5, atol 1e-7.
"""
import os

import pytest
import torch

from deepspeed_child import NEEDS_DEEPSPEED
from distributed import run_ranks
from test_ds_checkpoint import TiedNet, batch

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

STAGES = (0, 1, 2)


def _config(stage):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 1.0, "zero_allow_untested_optimizer": True,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": stage},
            "torch_autocast": {"enabled": True, "dtype": "bfloat16"}}


def _both(rank):
    import deepspeed   # only in the ranks: the tests' parent process stays free of it
    from minitron.runtime import initialize

    torch.set_num_threads(1)
    out = {}
    for stage in STAGES:
        for who, init in (("minitron", initialize), ("deepspeed", deepspeed.initialize)):
            engine, *_ = init(model=TiedNet(), config=_config(stage))
            losses, dtypes = [], set()
            for step in range(3):
                x, y = batch(step, rank, "fp32")
                pred = engine(x)
                dtypes.add(str(pred.dtype))
                loss = torch.nn.functional.mse_loss(pred.float(), y)
                engine.backward(loss)
                engine.step()
                losses.append(loss.item())
            out[f"{who}|{stage}"] = {"losses": losses, "dtypes": sorted(dtypes),
                                     "weights": torch.cat([p.detach().reshape(-1).clone()
                                                           for p in engine.module.parameters()])}
    return out


@pytest.fixture(scope="module")
def both():
    return run_ranks(_both, world_size=2, tp=None)


@pytest.mark.parametrize("stage", STAGES)
def test_same_losses_and_weights_as_deepspeed(both, stage):
    for rank in (0, 1):
        mine, ds = both[rank][f"minitron|{stage}"], both[rank][f"deepspeed|{stage}"]
        assert mine["dtypes"] == ds["dtypes"] == ["torch.bfloat16"]
        assert mine["losses"] == pytest.approx(ds["losses"], rel=1e-5)
        torch.testing.assert_close(mine["weights"], ds["weights"], rtol=1e-5, atol=1e-7)
