"""test_ds_offload.py held against the real DeepSpeed 0.19.8 on its CPU accelerator:

* CPU-Adam: DeepSpeed's compiled kernel (the cpu_adam op, JIT-built once on first use, about a
  minute) and ops/adam/cpu_adam.py step the same tensors to the same bits, Adam and AdamW, with
  and without bias correction, over sizes with and without a scalar tail;
* the engines: ZeRO-Offload at stages 1 (the deprecated cpu_offload), 2 and 3 (with
  offload_param), the config's "Adam" built as CPU-Adam by both: the same losses and weights,
  bit for bit. Without gradient clipping: DeepSpeed's offload path sums the norm per parameter
  (complete_grad_norm_calculation_for_cpu_offload), in another order than minitron's float64
  sum over the partition, so a binding clip factor differs in its last bit (1 ulp on a few
  weights after three steps, measured while writing this);
* the deprecated keys resolve as DeepSpeed's pydantic model resolves them.
"""
import os

import pytest
import torch

from deepspeed_child import NEEDS_DEEPSPEED, answer_in_child
from distributed import run_ranks
from toy_models import toy_mlp

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

ADAM = {"type": "Adam", "params": {"lr": 0.01, "weight_decay": 0.01}}
CASES = {"stage1_cpu_offload": {"stage": 1, "cpu_offload": True},
         "stage2": {"stage": 2, "offload_optimizer": {"device": "cpu"}},
         "stage3_both": {"stage": 3, "offload_optimizer": {"device": "cpu"}, "offload_param": {"device": "cpu"}}}


def cpu_adam_mismatches(_unused) -> dict:
    """Elements where DeepSpeed's kernel and minitron's torch arithmetic disagree, per case."""
    from deepspeed.ops.adam import DeepSpeedCPUAdam as Theirs

    from minitron.ops.adam.cpu_adam import DeepSpeedCPUAdam as Ours
    out = {}
    for adamw in (True, False):
        for correct in (True, False):
            for n in (1000, 4099):   # 1000 = 62 x 16 + 8: a scalar tail; 4099 likewise, 3 long
                torch.manual_seed(n)
                w = torch.randn(n) * 0.05
                a, b = torch.nn.Parameter(w.clone()), torch.nn.Parameter(w.clone())
                kw = dict(lr=3e-3, weight_decay=0.1, adamw_mode=adamw, bias_correction=correct, betas=(0.9, 0.95),
                          eps=1e-6)
                theirs, ours = Theirs([a], **kw), Ours([b], **kw)
                for step in range(12):
                    g = torch.randn(n) * 10.0 ** (step % 4 - 2)
                    a.grad, b.grad = g.clone(), g.clone()
                    theirs.step()
                    ours.step()
                out[f"{adamw}-{correct}-{n}"] = sum(int((x != y).sum()) for x, y in (
                    (a.data, b.data), (theirs.state[a]["exp_avg"], ours.state[b]["exp_avg"]),
                    (theirs.state[a]["exp_avg_sq"], ours.state[b]["exp_avg_sq"])))
    return out


def test_cpu_adam_is_deepspeeds_kernel_to_the_bit():
    assert set(answer_in_child("test_ds_offload_peer", "cpu_adam_mismatches", "").values()) == {0}


def zero_configs(_unused) -> list:
    from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
    out = []
    for zero in ({"stage": 3, "cpu_offload": True, "cpu_offload_param": True},
                 {"stage": 2, "cpu_offload": False}, {"stage": 2, "offload_optimizer": {"device": "nvme",
                                                                                         "nvme_path": "/x"}}):
        z = DeepSpeedZeroConfig(**zero)
        out.append([None if c is None else c.device for c in (z.offload_optimizer, z.offload_param)])
    return out


def test_deprecated_keys_resolve_as_deepspeeds_model():
    from minitron.runtime.config import DeepSpeedConfig
    theirs = answer_in_child("test_ds_offload_peer", "zero_configs", "")
    ours = []
    for zero in ({"stage": 3, "cpu_offload": True, "cpu_offload_param": True},
                 {"stage": 2, "cpu_offload": False}, {"stage": 2, "offload_optimizer": {"device": "nvme",
                                                                                         "nvme_path": "/x"}}):
        z = DeepSpeedConfig({"train_batch_size": 2, "zero_optimization": zero}).zero_config
        ours.append([None if c is None else c.device for c in (z.offload_optimizer, z.offload_param)])
    assert ours == theirs


def _both(rank):
    import deepspeed   # only in the ranks: the tests' parent process stays free of it
    import torch.distributed as dist

    from minitron.runtime import initialize
    out = {}
    for name, zero in CASES.items():
        for who, init in (("minitron", initialize), ("deepspeed", deepspeed.initialize)):
            model = toy_mlp(0, 6, 3)
            engine, *_ = init(model=model, model_parameters=model.parameters(), config={
                "train_batch_size": 4, "gradient_clipping": 0.0, "optimizer": ADAM, "zero_optimization": zero})
            losses = []
            for step in range(3):
                g = torch.Generator().manual_seed(step)
                x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
                loss = torch.nn.functional.mse_loss(engine(x[2 * rank:2 * rank + 2]), y[2 * rank:2 * rank + 2])
                engine.backward(loss)
                engine.step()
                t = loss.detach().clone()
                dist.all_reduce(t)
                losses.append(t.item())
            if zero["stage"] == 3:
                weights = [w.tolist() for w in _gathered(engine, who)]
            else:
                weights = [p.detach().tolist() for p in engine.module.parameters()]
            out[name, who] = {"losses": losses, "weights": weights,
                              "optimizer": type(engine.optimizer.optimizer).__name__}
    return out


def _gathered(engine, who) -> list:
    if who == "minitron":
        engine.optimizer.gather(list(engine.module.parameters()))
        return [p.detach().clone() for p in engine.module.parameters()]
    import deepspeed
    with deepspeed.zero.GatheredParameters(list(engine.module.parameters())):
        return [p.detach().clone() for p in engine.module.parameters()]


@pytest.fixture(scope="module")
def both():
    return run_ranks(_both, world_size=2, tp=None)


@pytest.mark.parametrize("name", list(CASES))
def test_offloaded_engines_agree_with_deepspeeds(both, name):
    for rank in (0, 1):
        mine, ds = both[rank][name, "minitron"], both[rank][name, "deepspeed"]
        assert mine["optimizer"] == ds["optimizer"] == "DeepSpeedCPUAdam"
        assert mine["losses"] == ds["losses"] and mine["weights"] == ds["weights"]
