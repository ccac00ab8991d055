"""OptimizerParamScheduler: warm-up, linear / cosine / inverse-square-root decay, weight-decay
increase, per-group peaks and multipliers, steps counted in samples, and resuming from a state dict."""

import math

import pytest

from minitron.core.optimizer_param_scheduler import OptimizerParamScheduler


class _Opt:
    """Anything with param_groups will do: the scheduler only writes 'lr' and 'weight_decay'."""

    def __init__(self):
        # The second group has a peak of its own (--decoupled-lr's form), and an lr_mult that
        # Megatron-Core 0.19 no longer reads.
        self.param_groups = [{"wd_mult": 1.0}, {"wd_mult": 0.0, "max_lr": 2.0, "min_lr": 0.2, "lr_mult": 3.0}]


def _sched(style="cosine", **kw):
    args = dict(init_lr=0.0, max_lr=1.0, min_lr=0.1, lr_warmup_steps=100, lr_decay_steps=1100,
                lr_decay_style=style, start_wd=0.0, end_wd=0.1, wd_incr_steps=1000, wd_incr_style="linear")
    args.update(kw)
    return OptimizerParamScheduler(_Opt(), **args)


def _lr_at(sched, n):
    sched.num_steps = n
    return sched.get_lr()


@pytest.mark.parametrize("style, n, expected", [
    ("cosine", 0, 0.0), ("cosine", 50, 0.5), ("cosine", 100, 1.0),          # linear warm-up
    ("cosine", 350, 0.1 + 0.9 * 0.5 * (math.cos(math.pi / 4) + 1)),
    ("cosine", 600, 0.55), ("cosine", 1100, 0.1), ("cosine", 5000, 0.1),   # half way, end, after
    ("linear", 350, 0.775), ("linear", 600, 0.55), ("linear", 1100, 0.1),
    ("constant", 600, 1.0), ("constant", 5000, 1.0),
    ("inverse-square-root", 400, 0.5), ("inverse-square-root", 1000, math.sqrt(0.1)),
])
def test_lr_curve(style, n, expected):
    assert _lr_at(_sched(style), n) == pytest.approx(expected)


def test_step_counts_samples_and_sets_every_group():
    sched = _sched()
    global_batch = 32                     # num_microbatches x micro_batch_size x dp
    for _ in range(3):
        sched.step(increment=global_batch)
    assert sched.num_steps == 96
    decay, no_decay = sched.optimizer.param_groups
    assert decay["lr"] == pytest.approx(0.96) and no_decay["lr"] == pytest.approx(1.92)   # its own peak
    assert decay["weight_decay"] == pytest.approx(0.1 * 96 / 1000)
    assert no_decay["weight_decay"] == 0.0  # wd_mult 0: biases and norms


def test_weight_decay_increase_styles():
    linear, cosine = _sched(), _sched(wd_incr_style="cosine")
    linear.num_steps = cosine.num_steps = 500
    assert linear.get_wd() == pytest.approx(0.05) and cosine.get_wd() == pytest.approx(0.05)
    cosine.num_steps = 250
    assert cosine.get_wd() == pytest.approx(0.1 * 0.5 * (math.cos(math.pi * 0.75) + 1))
    cosine.num_steps = 2000
    assert cosine.get_wd() == 0.1


def test_resume_from_state_dict():
    sched = _sched()
    sched.step(increment=700)
    resumed = _sched()
    resumed.load_state_dict(sched.state_dict())
    assert resumed.num_steps == 700
    assert resumed.optimizer.param_groups[0]["lr"] == sched.optimizer.param_groups[0]["lr"]
    strict = _sched(max_lr=2.0, use_checkpoint_opt_param_scheduler=False)
    with pytest.raises(ValueError, match="max_lr is 2.0 now but 1.0 in the checkpoint"):
        strict.load_state_dict(sched.state_dict())


@pytest.mark.parametrize("kw, message", [
    (dict(lr_warmup_steps=2000), "lr_warmup_steps"),
    (dict(lr_decay_style="exponential"), "lr_decay_style"),
    (dict(min_lr=2.0), "min_lr"),
])
def test_bad_schedule_says_what_is_wrong(kw, message):
    with pytest.raises(ValueError, match=message):
        _sched(**kw)
