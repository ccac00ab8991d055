"""The fp16/bf16 sections' options (runtime/precision_config.py), as DeepSpeed 0.19.8 acts on them:
bf16.check_grad_overflow decides whether a NaN gradient skips the step at ZeRO stages 1-2 (and
nothing at stage 0 or with fp16, which always check), fp16.auto_cast casts the floating inputs of
the engine's forward to fp16 (fp16 enabled or not), immediate_grad_update is accepted, and the
16-bit master weights are refused with DeepSpeed's reasons, before any rank starts.

One engine run per case on 2 gloo ranks (a 4-element linear model, one step): exact, since a
skipped step leaves the weights bit-equal and a taken one makes them NaN.
"""

from __future__ import annotations

import math

import pytest
import torch

from distributed import run_ranks
from minitron.runtime import DeepSpeedConfig, DeepSpeedConfigError


class Recorder(torch.nn.Module):
    """``w · x`` summed; remembers the dtypes its inputs arrived in."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.Parameter(torch.ones(4))
        self.seen = []

    def forward(self, x, extra=None):
        self.seen.append([str(x.dtype), str(extra[0].dtype) if extra is not None else None])
        return (self.w * x.to(self.w.dtype)).float().sum()


def _config(precision: dict, stage: int) -> dict:
    return {"train_batch_size": 2, "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
            "zero_allow_untested_optimizer": True, "zero_optimization": {"stage": stage}, **precision}


CASES = {   # name: (precision sections, stage, the step is taken on a NaN gradient)
    "bf16 stage 1, default": ({"bf16": {"enabled": True}}, 1, False),
    "bf16 stage 1, no check": ({"bf16": {"enabled": True, "check_grad_overflow": False}}, 1, True),
    "bf16 stage 2, no check": ({"bf16": {"enabled": True, "check_grad_overflow": False}}, 2, True),
    "bf16 stage 0, no check (not read)": ({"bf16": {"enabled": True, "check_grad_overflow": False}}, 0, False),
    "fp16 stage 1, no check (not read)": ({"fp16": {"enabled": True}, "bf16": {"check_grad_overflow": False}}, 1,
                                          False),
}


def _body(rank):
    from minitron.runtime import initialize

    torch.set_num_threads(1)
    out = {}
    for name, (precision, stage, _) in CASES.items():
        engine, *_ = initialize(model=Recorder(), config=_config(precision, stage))
        loss = engine(torch.full((4,), math.nan))   # every gradient NaN on both ranks
        engine.backward(loss)
        engine.step()
        w = engine.module.w.detach().float()
        out[name] = {"applied": engine.was_step_applied(), "nan": bool(w.isnan().all()), "ones": bool((w == 1).all())}
    for fp16 in (True, False):
        engine, *_ = initialize(model=Recorder(), config=_config({"fp16": {"enabled": fp16, "auto_cast": True}}, 0))
        engine(torch.ones(4), extra=[torch.ones(1)])   # the keyword input is not cast
        engine((torch.ones(4, dtype=torch.float64)))
        engine(torch.ones(4, dtype=torch.int64))
        out[f"auto_cast, fp16 {fp16}"] = engine.module.seen
    return out


@pytest.fixture(scope="module")
def results():
    return run_ranks(_body, world_size=2, tp=None)


def test_check_grad_overflow_decides_whether_a_nan_gradient_is_stepped(results):
    for rank in results:
        for name, (_, _, taken) in CASES.items():
            row = rank[name]
            assert row == {"applied": taken, "nan": taken, "ones": not taken}, name


def test_auto_cast_makes_floating_inputs_fp16(results):
    for fp16 in (True, False):
        assert results[0][f"auto_cast, fp16 {fp16}"] == [["torch.float16", "torch.float32"],
                                                         ["torch.float16", None], ["torch.int64", None]]


def _options(**sections) -> dict:
    return DeepSpeedConfig({"train_batch_size": 2, **sections}, world_size=1).precision_options


def test_options_read_with_deepspeeds_defaults():
    assert _options() == {"auto_cast": False, "fp16_master_weights_and_grads": False,
                          "immediate_grad_update": False, "check_grad_overflow": True,
                          "bf16_master_weights_and_grads": False, "bf16_optimizer_states": False}
    # pydantic's lax bools, as DeepSpeed's models read them; immediate_grad_update is accepted
    assert _options(bf16={"enabled": True, "immediate_grad_update": "true", "check_grad_overflow": 0}) \
        == {**_options(), "immediate_grad_update": True, "check_grad_overflow": False}


@pytest.mark.parametrize("sections, words", [
    ({"fp16": {"enabled": True, "fp16_master_weights_and_grads": True}}, "only with ZeRO stage 1, 2 or 3"),
    ({"bf16": {"enabled": True, "bf16_master_weights_and_grads": True}, "zero_optimization": {"stage": 2}},
     "requires ZeRO-Offload with DeepSpeedCPUAdam"),
    ({"fp16": {"fp16_master_weights_and_grads": True}, "bf16": {"bf16_master_weights_and_grads": True},
      "zero_optimization": {"stage": 1}}, "exclude each other"),
    ({"fp16": {"enabled": True, "auto_cast": "sometimes"}}, "fp16.auto_cast"),
    # bf16_optimizer_states: DeepSpeed's two assertions, then minitron's reason (no bf16 masters)
    ({"bf16": {"enabled": True, "bf16_optimizer_states": True}}, "only with ZeRO stage 1, 2 or 3"),
    ({"bf16": {"enabled": True, "bf16_optimizer_states": True}, "zero_optimization": {"stage": 1}},
     "requires bf16.bf16_master_weights_and_grads"),
    ({"bf16": {"enabled": True, "bf16_optimizer_states": True, "bf16_master_weights_and_grads": True},
      "zero_optimization": {"stage": 2}}, "sit on bf16 master weights"),
])
def test_refused_in_one_line(sections, words):
    with pytest.raises(DeepSpeedConfigError, match=words) as err:
        _options(**sections)
    assert "\n" not in str(err.value)
