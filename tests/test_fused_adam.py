"""DeepSpeed's FusedAdam in plain torch (minitron/ops/adam/fused_adam.py): the engine builds it
for a ds_config's "Adam" or "AdamW" as DeepSpeed 0.19.8 decides, it steps as torch's Adam and
AdamW do, it keeps FusedAdam's state form, and runtime/checkpoint/adam_state.py moves a state
between that form and torch's without changing the steps that follow. In one process, a few
milliseconds; tests/test_ds_peer.py holds the files against the real DeepSpeed."""

import copy
from types import SimpleNamespace

import pytest
import torch

from minitron.ops.adam import FusedAdam
from minitron.runtime import DeepSpeedConfig
from minitron.runtime.checkpoint.adam_state import running_form
from minitron.runtime.engine_optimizer import configure_basic_optimizer


def _params(seed: int = 0) -> list:
    torch.manual_seed(seed)
    return [torch.nn.Parameter(torch.randn(5, 3)), torch.nn.Parameter(torch.randn(4))]


def _run(optimizer, params, steps) -> None:
    for step in steps:
        g = torch.Generator().manual_seed(100 + step)
        for p in params:
            p.grad = torch.randn(p.shape, generator=g)
        optimizer.step()


@pytest.mark.parametrize("adam_w_mode", (True, False))
def test_steps_as_torchs_adam(adam_w_mode):
    """Decoupled weight decay (AdamW) or an L2 term in the gradient (Adam): the same weights."""
    ours, theirs = _params(), _params()
    _run(FusedAdam(ours, lr=0.01, weight_decay=0.1, adam_w_mode=adam_w_mode), ours, range(6))
    torch_adam = torch.optim.AdamW if adam_w_mode else torch.optim.Adam
    _run(torch_adam(theirs, lr=0.01, weight_decay=0.1), theirs, range(6))
    for a, b in zip(ours, theirs):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6), (a - b).abs().max()


def test_keeps_fused_adams_state_form():
    params = _params()
    optimizer = FusedAdam(params, lr=0.01)
    _run(optimizer, params, range(2))
    state = optimizer.state_dict()
    assert list(state["param_groups"][0]) == ["lr", "bias_correction", "betas", "eps", "weight_decay", "step",
                                              "params"]
    assert state["param_groups"][0]["step"] == 0   # the count lives with each parameter, an int
    assert [(list(s), s["step"]) for s in state["state"].values()] == [(["step", "exp_avg", "exp_avg_sq"], 2)] * 2


@pytest.mark.parametrize("source, target", ((FusedAdam, torch.optim.AdamW), (torch.optim.AdamW, FusedAdam)))
def test_a_state_steps_on_in_the_other_form(source, target):
    """Three steps in one Adam, the state carried into the other, two more: the weights of five
    steps in the first. From DeepSpeed's FusedAdam only a group's last count is real."""
    params = _params()
    first = source(params, lr=0.01, weight_decay=0.1)
    _run(first, params, range(3))
    saved = copy.deepcopy(first.state_dict())   # as a file holds it: its own tensors
    if source is FusedAdam:
        saved["state"][0]["step"] = 0
    moved = [torch.nn.Parameter(p.detach().clone()) for p in params]
    second = target(moved, lr=0.5)   # the saved hyperparameters win
    second.load_state_dict(running_form(second, saved))
    assert second.param_groups[0]["lr"] == 0.01
    _run(first, params, range(3, 5))
    _run(second, moved, range(3, 5))
    for a, b in zip(moved, params):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-6), (a - b).abs().max()
    assert isinstance(second.state[moved[0]]["step"], int) == (target is FusedAdam)
    assert ("bias_correction" in second.param_groups[0]) == (target is FusedAdam)


@pytest.mark.parametrize("kind, params, chosen, decoupled", [
    ("Adam", {}, FusedAdam, True),                        # DeepSpeed's "Adam" is AdamW by default
    ("adam", {"adam_w_mode": False}, FusedAdam, False),
    ("AdamW", {"adam_w_mode": False}, FusedAdam, True),   # "AdamW" decouples whatever adam_w_mode says
    ("Adam", {"torch_adam": True}, torch.optim.AdamW, True),
    ("Adam", {"torch_adam": True, "adam_w_mode": False}, torch.optim.Adam, False),
    ("AdamW", {"torch_adam": False}, FusedAdam, True),
])
def test_the_engine_builds_the_adam_deepspeed_builds(kind, params, chosen, decoupled):
    config = DeepSpeedConfig({"train_batch_size": 2, "optimizer": {"type": kind, "params": params}}, world_size=1)
    engine = SimpleNamespace(_config=config, module=torch.nn.Linear(2, 2))
    optimizer = configure_basic_optimizer(engine, None, None)
    assert type(optimizer) is chosen
    if chosen is FusedAdam:
        assert optimizer.adam_w_mode == int(decoupled)
