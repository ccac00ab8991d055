"""The ds_config's torch_autocast section (runtime/torch_autocast.py), run as DeepSpeed 0.19.8 runs
it, on two forked gloo ranks: the forward computes the Linear layers in bfloat16 over fp32
weights, and at ZeRO stages 1-3 the Linear layers' gradients cross the data-parallel group in
bfloat16 (so the mean the optimizer sees is a bfloat16 number), while stage 0, or an empty
lower_precision_safe_modules, reduces them in fp32. test_ds_torch_autocast_peer.py holds the
losses against DeepSpeed's own engine.
"""

import pytest
import torch

from distributed import run_ranks
from minitron.runtime.config import DeepSpeedConfig
from minitron.runtime.config_values import DeepSpeedConfigError

AUTOCAST = {"enabled": True, "dtype": "bfloat16"}


def cfg(stage=0, autocast=AUTOCAST, **zero):
    return {"train_micro_batch_size_per_gpu": 2, "gradient_clipping": 0.0, "zero_allow_untested_optimizer": True,
            "optimizer": {"type": "SGD", "params": {"lr": 0.1}}, "zero_optimization": {"stage": stage, **zero},
            "torch_autocast": autocast}


@pytest.mark.parametrize("config, words", [
    (cfg(autocast={"enabled": True, "dtype": "fp16"}), "torch.amp.GradScaler"),
    (cfg(autocast={"enabled": True, "dtype": "int3"}), "torch_autocast.dtype must be bfloat16"),
    (cfg(autocast={"enabled": "yes"}), "torch_autocast.enabled must be true or false"),
    (cfg(autocast={"enabled": True, "lower_precision_safe_modules": "torch.nn.Linear"}), "must be a list"),
    (cfg(autocast={"enabled": True, "lower_precision_safe_modules": ["torch.nn.Lineal"]}), "cannot import"),
    (cfg(autocast={"enabled": True, "dtipe": "bf16"}), "torch_autocast"),
    (cfg(3, zero_quantized_weights=True), "refuses the pair"),
])
def test_refused_in_one_line(config, words):
    with pytest.raises(DeepSpeedConfigError) as refused:
        DeepSpeedConfig(config, world_size=2)
    assert words in str(refused.value) and "\n" not in str(refused.value)


class TwoLinear(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.a, self.b = torch.nn.Linear(6, 8), torch.nn.Linear(8, 3)

    def forward(self, x):
        return self.b(torch.tanh(self.a(x)))


class Recording(torch.optim.SGD):
    """SGD that keeps the gradients it was handed (the reduced mean, ZeRO's partition of it)."""

    def step(self, closure=None):
        self.seen = torch.cat([p.grad.reshape(-1).clone() for g in self.param_groups for p in g["params"]])
        return super().step(closure)


def _step(config, rank):
    from minitron.runtime import initialize
    model = TwoLinear()
    engine, *_ = initialize(model=model, optimizer=Recording(model.parameters(), lr=0.1), config=config)
    g = torch.Generator().manual_seed(rank)
    out = engine(torch.randn(2, 6, generator=g))
    engine.backward(out.float().pow(2).mean())
    engine.step()
    grads = engine.basic_optimizer.seen
    return {"out_dtype": out.dtype, "weight_dtype": engine.module.a.weight.dtype,
            "bf16_exact": bool(torch.equal(grads, grads.bfloat16().float())), "grads": grads.numel()}


def _on_rank(rank):
    torch.set_num_threads(1)
    out = {f"stage{s}": _step(cfg(s), rank) for s in (0, 1, 2, 3)}
    out["stage2_none_safe"] = _step(cfg(2, autocast={**AUTOCAST, "lower_precision_safe_modules": []}), rank)
    out["stage1_off"] = _step(cfg(1, autocast={"enabled": False}), rank)
    return out


@pytest.fixture(scope="module")
def ranks():
    return run_ranks(_on_rank, world_size=2, tp=None)


def test_forward_in_bf16_over_fp32_weights(ranks):
    for stage in (0, 1, 2, 3):
        got = ranks[0][f"stage{stage}"]
        assert (got["out_dtype"], got["weight_dtype"]) == (torch.bfloat16, torch.float32)
    assert ranks[0]["stage1_off"]["out_dtype"] == torch.float32


def test_linear_gradients_travel_in_bf16_from_stage_1(ranks):
    # The optimizer's gradient is the mean over the ranks as it came off the wire: a bfloat16
    # number (cast back to fp32) when it travelled in bf16. Each rank's gradient is a bf16
    # number already (the matmuls ran in bf16), but their fp32 mean takes one bit more about
    # half the time: all 42 elements bf16 by chance, about 2^-42
    for rank in (0, 1):
        got = ranks[rank]
        assert all(got[f"stage{s}"]["bf16_exact"] for s in (1, 2, 3)) and got["stage1_off"]["grads"] > 20
        assert not got["stage0"]["bf16_exact"]             # stage 0: the engine's fp32 all-reduce
        assert not got["stage2_none_safe"]["bf16_exact"]   # no module marked: every gradient in fp32
        assert not got["stage1_off"]["bf16_exact"]
