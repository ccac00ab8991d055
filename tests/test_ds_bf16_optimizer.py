"""data_types.grad_accum_dtype fp32 under bf16 at ZeRO stage 1: DeepSpeed 0.19.8's BF16_Optimizer
(runtime/bf16_optimizer.py), on two forked gloo ranks. Each backward's bf16 gradients go into a
full fp32 buffer (4 bytes a parameter held between micro-batches, where ZeRO-1 holds 2), the
boundary all-reduces it, and over eight micro-batches the sum lands elsewhere than bf16
accumulation's; bf16.immediate_grad_update adds from hooks, to the same weights.
test_ds_bf16_optimizer_peer.py holds the weights against DeepSpeed's own.
"""

import pytest
import torch

from distributed import run_ranks
from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError
from test_ds_checkpoint import TiedNet, batch


def cfg(stage=1, accum="fp32", gas=8, **zero):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": gas, "bf16": {"enabled": True},
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_allow_untested_optimizer": True,
            "zero_optimization": {"stage": stage, **zero}, "data_types": {"grad_accum_dtype": accum}}


@pytest.mark.parametrize("config, words", [
    (cfg(0), "NotImplementedError"),
    (cfg(2), "separate accumulation buffers"),
    (cfg(1, offload_optimizer={"device": "cpu"}), "separate accumulation buffers"),
    (cfg(1, compute_grad_norm=False, **{}) | {"gradient_clipping": 0.0}, "compute_grad_norm false"),
])
def test_refused_in_one_line(config, words):
    with pytest.raises(DeepSpeedConfigError) as refused:
        DeepSpeedConfig(config, world_size=2)
    assert words in str(refused.value) and "\n" not in str(refused.value)


def _run(config, rank):
    from minitron.runtime import initialize
    engine, *_ = initialize(model=TiedNet(), config=config)
    held = []
    for i in range(config["gradient_accumulation_steps"]):
        x, y = batch(i, rank, "bf16")
        engine.backward(torch.nn.functional.mse_loss(engine(x).float(), y))
        held.append(engine.bytes_held()["grads"])
        engine.step()
    return {"kind": type(engine.optimizer).__name__, "held": held[0], "params": engine.bytes_held()["params"],
            "weights": torch.cat([p.detach().float().reshape(-1) for p in engine.module.parameters()])}


def _on_rank(rank):
    torch.set_num_threads(1)
    out = {accum: _run(cfg(accum=accum), rank) for accum in ("fp32", "bf16")}
    out["immediate"] = _run({**cfg(), "bf16": {"enabled": True, "immediate_grad_update": True}}, rank)
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_on_rank, world_size=2, tp=None)


def test_bf16_optimizer_holds_fp32_gradients(ranks):
    fp32, bf16 = ranks[0]["fp32"], ranks[0]["bf16"]
    assert (fp32["kind"], bf16["kind"]) == ("BF16_Optimizer", "DeepSpeedZeroOptimizer")
    # the fp32 buffer is as long as the bf16 flat buffer (padding included): twice its bytes
    assert fp32["held"] == 2 * fp32["params"] and bf16["held"] < fp32["held"]


def test_fp32_accumulation_lands_elsewhere(ranks):
    for rank in (0, 1):
        diff = (ranks[rank]["fp32"]["weights"] - ranks[rank]["bf16"]["weights"]).abs()
        assert diff.max() > 0   # the eight bf16 roundings of the running sum show in the step
    torch.testing.assert_close(ranks[0]["fp32"]["weights"], ranks[1]["fp32"]["weights"], rtol=0, atol=0)


def test_immediate_grad_update_same_sums(ranks):
    # the hooks add each gradient during backward instead of after it: the same additions in the
    # same order per element, so the same weights to the bit
    for rank in (0, 1):
        assert torch.equal(ranks[rank]["immediate"]["weights"], ranks[rank]["fp32"]["weights"])
