"""DeepSpeed's lr schedules: WarmupCosineLR, OneCycle and LRRangeTest (with WarmupLR and
WarmupDecayLR alongside), a few values by hand, the ds_config's scheduler section, and (marked
deepspeed) the lr and momentum of every step held against DeepSpeed 0.19.8's own classes.

The peer test runs DeepSpeed in a child process, as test_ds_peer.py keeps DeepSpeed out of the
tests' parent process; both sides run the same ``trace`` and the child hands back JSON, whose
floats come back bit for bit.
"""

import importlib
import json
import math

import pytest
import torch

from deepspeed_child import answer_in_child, needs_deepspeed

from minitron.runtime.config_sections import DeepSpeedConfigError, parse_scheduler
from minitron.runtime.lr_schedules import SCHEDULERS, OneCycle, WarmupCosineLR
from minitron.runtime.lr_schedules_cycle import LRRangeTest

STEPS, RESUME_AT = 50, 23

CASES = [
    ("WarmupCosineLR", {"total_num_steps": 40, "warmup_num_steps": 10}),
    ("WarmupCosineLR", {"total_num_steps": 30, "warmup_num_steps": 5, "warmup_type": "linear",
                        "warmup_min_ratio": 0.1, "cos_min_ratio": 0.01}),
    ("WarmupCosineLR", {"total_num_steps": 5, "warmup_num_steps": 10}),     # no room to decay
    ("WarmupCosineLR", {"total_num_steps": 45, "warmup_num_steps": 1}),     # raised to 2
    ("OneCycle", {"cycle_min_lr": 1e-4, "cycle_max_lr": 1e-2, "cycle_first_step_size": 10}),
    ("OneCycle", {"cycle_min_lr": 1e-3, "cycle_max_lr": 5e-3, "cycle_first_step_size": 7,
                  "cycle_second_step_size": 13, "decay_step_size": 3, "decay_lr_rate": 0.5, "decay_mom_rate": 0.1}),
    ("OneCycle", {"cycle_min_lr": 0.0, "cycle_max_lr": 1.0, "cycle_first_step_size": 12, "cycle_second_step_size": 8,
                  "cycle_first_stair_count": 4, "cycle_second_stair_count": 2, "cycle_min_mom": 0.85}),
    ("OneCycle", {"cycle_min_lr": 0.01, "cycle_max_lr": 0.1, "cycle_first_step_size": 9, "cycle_second_step_size": 0,
                  "cycle_first_stair_count": 3, "cycle_momentum": False, "decay_step_size": 2, "decay_lr_rate": 1.0}),
    ("LRRangeTest", {"lr_range_test_min_lr": 1e-4, "lr_range_test_step_size": 5, "lr_range_test_step_rate": 2.0}),
    ("LRRangeTest", {"lr_range_test_min_lr": 1e-3, "lr_range_test_step_size": 3, "lr_range_test_staircase": True}),
    ("LRRangeTest", {"lr_range_test_min_lr": [0.01, 0.02], "lr_range_test_step_size": 1,
                     "lr_range_test_step_rate": 0.5}),
    ("WarmupLR", {"warmup_min_lr": 1e-5, "warmup_num_steps": 12}),
    ("WarmupDecayLR", {"total_num_steps": 40, "warmup_max_lr": 0.02, "warmup_num_steps": 8,
                       "warmup_type": "linear"}),
]


def _optimizer():
    """Two param groups with their own lr, so a schedule that reads each group's lr shows it."""
    weights = [torch.nn.Parameter(torch.zeros(2)), torch.nn.Parameter(torch.zeros(2))]
    return torch.optim.AdamW([{"params": [weights[0]], "lr": 0.1}, {"params": [weights[1]], "lr": 0.05}])


def _groups(optimizer) -> list:
    return [[group["lr"], list(group["betas"])] for group in optimizer.param_groups]


def trace(module_name: str) -> list:
    """For each case: lr and betas of each group at construction and after each of STEPS steps,
    then the steps after RESUME_AT again, from a fresh optimizer and schedule given the state_dict."""
    module = importlib.import_module(module_name)
    out = []
    for name, params in CASES:
        optimizer = _optimizer()
        schedule = getattr(module, name)(optimizer, **params)
        seen = [_groups(optimizer)]
        for step in range(STEPS):
            schedule.step()
            seen.append(_groups(optimizer))
            if step + 1 == RESUME_AT:
                saved = schedule.state_dict()
        optimizer = _optimizer()
        schedule = getattr(module, name)(optimizer, **params)
        schedule.load_state_dict(saved)
        resumed = []
        for _ in range(STEPS - RESUME_AT):
            schedule.step()
            resumed.append(_groups(optimizer))
        out.append({"steps": seen, "resumed": resumed, "state": saved})
    return out


# --- minitron alone ------------------------------------------------------------------------------

def _lrs(schedule, n: int) -> list:
    lrs = [schedule.optimizer.param_groups[0]["lr"]]
    for _ in range(n):
        schedule.step()
        lrs.append(schedule.optimizer.param_groups[0]["lr"])
    return lrs


def test_warmup_cosine_values():
    lrs = _lrs(WarmupCosineLR(_optimizer(), total_num_steps=12, warmup_num_steps=4, warmup_type="linear",
                              cos_min_ratio=0.0), 14)
    # lr 0 before the first step, then 0/4, 1/4, 2/4, 3/4 of 0.1; the cosine starts at t = 4
    # with progress 1/8 and reaches the floor (0) at t = 11, where it stays.
    assert lrs[:5] == pytest.approx([0.0, 0.0, 0.025, 0.05, 0.075])
    assert lrs[5] == pytest.approx(0.1 * (1 + math.cos(math.pi / 8)) / 2)
    assert lrs[12:] == pytest.approx([0.0, 0.0, 0.0])


def test_one_cycle_values():
    optimizer = _optimizer()
    lrs = _lrs(OneCycle(optimizer, 0.0, 1.0, cycle_first_step_size=4, decay_step_size=2, decay_lr_rate=1.0), 8)
    # Up in quarters over 4 steps, down over 4 (t + 1 counts), then the decay of min_lr (0 here).
    assert lrs == pytest.approx([0.0, 0.25, 0.5, 0.75, 1.0, 0.75, 0.5, 0.25, 0.0])
    assert optimizer.param_groups[0]["betas"] == (pytest.approx(0.9), 0.99)    # momentum is low at the peak only


def test_one_cycle_momentum_opposes_lr():
    optimizer = _optimizer()
    schedule = OneCycle(optimizer, 0.0, 1.0, cycle_first_step_size=2)
    schedule.step(1)   # the peak: t + 1 = 2
    assert optimizer.param_groups[0]["lr"] == 1.0
    assert optimizer.param_groups[0]["betas"] == (pytest.approx(0.8), 0.99)


def test_range_test_values():
    assert _lrs(LRRangeTest(_optimizer(), 0.1, lr_range_test_step_size=2), 4) == \
        pytest.approx([0.1, 0.15, 0.2, 0.25, 0.3])
    assert _lrs(LRRangeTest(_optimizer(), 0.1, lr_range_test_step_size=2, lr_range_test_staircase=True), 4) == \
        pytest.approx([0.1, 0.1, 0.2, 0.2, 0.3])   # whole intervals: (t + 1) // 2


@pytest.mark.parametrize("name, params", CASES)
def test_state_dict_round_trip(name, params):
    optimizer = _optimizer()
    schedule = SCHEDULERS[name](optimizer, **params)
    _lrs(schedule, 7)
    resumed = SCHEDULERS[name](_optimizer(), **params)
    resumed.load_state_dict(schedule.state_dict())
    assert _lrs(resumed, 5)[1:] == _lrs(schedule, 5)[1:]


def _config(kind: str, params: dict) -> dict:
    return {"scheduler": {"type": kind, "params": params}}


def test_config_defaults_are_deepspeeds():
    assert parse_scheduler(_config("WarmupCosineLR", {"total_num_steps": 100}))[1] == {
        "total_num_steps": 100, "warmup_min_ratio": 0.0, "warmup_num_steps": 1000, "cos_min_ratio": 0.0001,
        "warmup_type": "log"}
    assert parse_scheduler(_config("LRRangeTest", {}))[1] == {
        "lr_range_test_min_lr": 1e-3, "lr_range_test_step_size": 2000, "lr_range_test_step_rate": 1.0,
        "lr_range_test_staircase": False}
    cycle = parse_scheduler(_config("OneCycle", {"cycle_min_lr": 0.001, "cycle_max_lr": 0.01}))[1]
    assert cycle["cycle_first_step_size"] == 2000 and cycle["cycle_second_step_size"] is None
    assert (cycle["cycle_min_mom"], cycle["cycle_max_mom"], cycle["decay_step_size"]) == (0.8, 0.9, 0)


@pytest.mark.parametrize("kind, params, says", [
    ("WarmupCosineLR", {}, "total_num_steps is required by WarmupCosineLR"),
    ("WarmupCosineLR", {"total_num_steps": 10, "warmup_num_steps": 2.5}, "warmup_num_steps must be a whole"),
    ("OneCycle", {"cycle_max_lr": 0.1}, "cycle_min_lr is required by OneCycle"),
    ("OneCycle", {"cycle_min_lr": 0, "cycle_max_lr": 0.1, "cycle_first_step_size": 0}, "must be positive"),
    ("OneCycle", {"cycle_min_lr": 0, "cycle_max_lr": 0.1, "cycle_momentum": "yes"}, "true or false"),
    ("OneCycle", {"cycle_min_lr": 0, "cycle_max_lr": 0.1, "cycle_stair_count": 2}, "unknown key"),
    ("LRRangeTest", {"lr_range_test_step_size": 0}, "at least 1"),
    ("LRRangeTest", {"lr_range_test_staircase": 1}, "true or false"),
    ("Cosine", {}, "neither DeepSpeed's"),   # torch has no such schedule either
    ("CyclicLR", {}, "missing 2 required positional arguments"),   # torch's, found by its constructor
])
def test_config_refusals(kind, params, says):
    with pytest.raises(DeepSpeedConfigError, match=says):
        parse_scheduler(_config(kind, params))


def test_every_case_parses_as_its_config():
    """The parser hands on what the constructors take (the per-group list is the exception)."""
    for name, params in CASES:
        if not any(isinstance(v, list) for v in params.values()):
            kind, parsed = parse_scheduler(_config(name, params))
            SCHEDULERS[kind](_optimizer(), **parsed)


# --- against DeepSpeed 0.19.8 ----------------------------------------------------------------------

@needs_deepspeed
def test_same_steps_as_deepspeed():
    theirs = answer_in_child("test_ds_schedules", "trace", "deepspeed.runtime.lr_schedules")
    ours = json.loads(json.dumps(trace("minitron.runtime.lr_schedules")))
    for (name, params), mine, ds in zip(CASES, ours, theirs, strict=True):
        assert mine == ds, f"{name} {params}"


def test_the_engine_builds_each_schedule_and_one_cycle_reaches_adams_betas():
    """From the ds_config, at every ZeRO stage: the schedule steps the torch Adam under the ZeRO
    wrapper, betas included (OneCycle looks for them in that optimizer's defaults)."""
    from distributed import run_ranks   # the tests' forked-rank helper, only for this test

    def body(rank):
        from minitron.runtime import initialize   # in the rank: the engine needs its process group
        from minitron.runtime.lr_schedules_cycle import torch_optimizer   # (what OneCycle unwraps)
        seen = {}
        for stage in (0, 1, 2, 3):
            config = {"train_batch_size": 2, "optimizer": {"type": "Adam", "params": {"lr": 0.01}},
                      "zero_optimization": {"stage": stage},
                      "scheduler": {"type": "OneCycle", "params": {"cycle_min_lr": 0.0, "cycle_max_lr": 1e-3,
                                                                   "cycle_first_step_size": 2}}}
            engine, *_ = initialize(model=torch.nn.Linear(4, 2), config=config)
            for _ in range(2):
                engine.backward(engine(torch.ones(2, 4)).sum())
                engine.step()
            group = torch_optimizer(engine.optimizer).param_groups[0]
            seen[stage] = (group["lr"], group["betas"])
        return seen

    seen = run_ranks(body, world_size=1, tp=None)[0]
    # After two steps t = 1, the peak: lr at cycle_max_lr, beta1 at cycle_min_mom.
    assert all(lr == pytest.approx(1e-3) and betas == (pytest.approx(0.8), 0.99) for lr, betas in seen.values()), seen
