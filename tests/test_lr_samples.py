"""The schedule flags of Megatron-Core 0.19, without ranks: the learning rate counted in samples
(--lr-warmup-samples, --lr-decay-samples), warmup-stable-decay, --decoupled-lr's param group,
and --step-batch-size-schedule's batches and run length. (tests/test_mcore_scheduler.py holds
the same numbers against Megatron-Core's own classes.)"""

import math

import pytest
import torch

import minitron.training.model_setup as model_setup
from minitron.core.num_microbatches_calculator import StepBatchsizeNumMicroBatchesCalculator
from minitron.core.optimizer import OptimizerConfig, _get_param_groups
from minitron.core.optimizer_param_scheduler import OptimizerParamScheduler, get_canonical_lr_for_logging
from minitron.training.arguments import build_parser, validate_args

MODEL = "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --micro-batch-size 1 --lr 1.0"


def _args(flags: str, world: int = 1):
    args = build_parser().parse_args(f"{MODEL} {flags}".split())
    args.rank, args.world_size = 0, world
    return validate_args(args, {"tokenizer_type": "NullTokenizer", "vocab_size": 64})


class _Opt:
    def __init__(self, groups=None):
        self.param_groups = groups or [{"wd_mult": 1.0}]


def _scheduler(monkeypatch, flags: str, world: int = 1):
    args = _args(flags, world)
    monkeypatch.setattr(model_setup, "get_args", lambda: args)
    return model_setup.get_optimizer_param_scheduler(_Opt())


def test_samples_are_the_steps_themselves(monkeypatch):
    s = _scheduler(monkeypatch, "--train-samples 1000 --lr-warmup-samples 100 --lr-decay-samples 600 --mock-data")
    assert (s.lr_warmup_steps, s.lr_decay_steps, s.wd_incr_steps) == (100, 600, 1000)
    s = _scheduler(monkeypatch, "--train-samples 1000 --lr-warmup-fraction 0.15 --mock-data")
    assert (s.lr_warmup_steps, s.lr_decay_steps) == (150, 1000)   # the fraction of the decay


def test_iterations_become_samples_at_the_global_batch(monkeypatch):
    s = _scheduler(monkeypatch, "--train-iters 50 --global-batch-size 4 --lr-warmup-iters 5 --lr-decay-style WSD "
                                "--lr-wsd-decay-iters 10 --lr-warmup-init 0.25 --mock-data", world=2)
    assert (s.lr_warmup_steps, s.lr_decay_steps, s.wsd_decay_steps, s.init_lr) == (20, 200, 40, 0.25)
    assert s.optimizer.param_groups[0]["lr"] == 0.25   # warm-up starts from --lr-warmup-init


@pytest.mark.parametrize("style, coeff_at_half", [
    ("linear", 0.5), ("cosine", 0.5), ("exponential", 2 * 0.5 ** 0.5 - 1), ("minus_sqrt", 1 - math.sqrt(0.5))])
def test_wsd_holds_then_anneals_over_its_last_steps(style, coeff_at_half):
    s = OptimizerParamScheduler(_Opt(), init_lr=0.0, max_lr=1.0, min_lr=0.1, lr_warmup_steps=10, lr_decay_steps=110,
                                lr_decay_style="WSD", start_wd=0.0, end_wd=0.0, wd_incr_steps=110,
                                wd_incr_style="constant", wsd_decay_steps=20, lr_wsd_decay_style=style)
    at = {}
    for n in (5, 50, 90, 100, 110, 200):
        s.num_steps = n
        at[n] = s.get_lr({})
    assert at[5] == pytest.approx(0.5)                      # warm-up
    assert at[50] == at[90] == 1.0                          # stable until 110 - 20
    assert at[100] == pytest.approx(0.1 + 0.9 * coeff_at_half)
    assert at[110] == pytest.approx(0.1) and at[200] == 0.1


def test_decoupled_lr_gives_embedding_and_output_their_own_group():
    model = torch.nn.Module()
    model.embedding = torch.nn.Parameter(torch.zeros(8, 4))
    model.embedding.is_embedding_or_output_parameter = True
    model.dense = torch.nn.Linear(4, 4)
    groups = _get_param_groups([model], OptimizerConfig(lr=1e-3, min_lr=1e-4, decoupled_lr=5e-3, decoupled_min_lr=5e-4))
    shape = [(len(g["params"]), g["wd_mult"], g["max_lr"], g["min_lr"], g["default_config"]) for g in groups]
    assert shape == [(1, 1.0, 1e-3, 1e-4, True),        # the dense weight
                     (1, 1.0, 5e-3, 5e-4, False),       # the embedding, on its own schedule
                     (1, 0.0, 1e-3, 1e-4, True)]        # the bias: no weight decay
    s = OptimizerParamScheduler(_Opt(groups), init_lr=0.0, max_lr=1e-3, min_lr=1e-4, lr_warmup_steps=0,
                                lr_decay_steps=10, lr_decay_style="linear", start_wd=0.01, end_wd=0.01,
                                wd_incr_steps=10, wd_incr_style="constant")
    s.step(5)
    assert [g["lr"] for g in groups] == pytest.approx([5.5e-4, 2.75e-3, 5.5e-4])
    assert get_canonical_lr_for_logging(groups) == pytest.approx(5.5e-4)   # the log shows the main lr
    plain = _get_param_groups([model], OptimizerConfig(lr=1e-3, min_lr=1e-4))   # no --decoupled-lr: two groups
    assert [len(g["params"]) for g in plain] == [2, 1]


def test_step_schedule_thresholds_count_tokens():
    calc = StepBatchsizeNumMicroBatchesCalculator(1, 2, False, 0, "0:4, 1.6K:8 3.2k:16", seq_length=16)
    assert calc.schedule == [(0, 4), (100, 8), (200, 16)] and calc.global_batch_size == 16
    seen = []
    for consumed in (0, 99, 100, 199, 200, 10**6):
        calc.update(consumed, consistency_check=True)
        seen.append((calc.get_current_global_batch_size(), calc.get()))
    assert seen == [(4, 2), (4, 2), (8, 4), (8, 4), (16, 8), (16, 8)]
    calc = StepBatchsizeNumMicroBatchesCalculator(1, 4, False, 0, "0:6", seq_length=None)   # samples; 6 % 4
    with pytest.raises(AssertionError, match="not divisible"):
        calc.update(0, consistency_check=True)


def test_step_schedule_sets_the_run_as_megatron_counts_it():
    args = _args("--train-samples 100 --step-batch-size-schedule 0:4,160:8,480:16 --mock-data", world=2)
    assert args.global_batch_size == 16
    # Megatron's update_train_iters: iterate while fewer than 100 samples are consumed.
    calc = StepBatchsizeNumMicroBatchesCalculator(1, 2, False, 0, "0:4 160:8 480:16", seq_length=16)
    consumed = iterations = 0
    while consumed < 100:
        calc.update(consumed, consistency_check=False)
        consumed += calc.get_current_global_batch_size()
        iterations += 1
    assert args.train_iters == iterations == 3 + 2 + 5   # 4 x 3 to 12, 8 x 2 to 28, 16 x 5 to 108
