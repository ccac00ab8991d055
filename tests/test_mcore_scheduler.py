"""The schedule flags against Megatron-Core 0.19.2's own code (marked mcore).

Four yardsticks, each Megatron's, each run on the same inputs as minitron's:

* its parser (megatron.training.arguments.add_megatron_arguments): the flags minitron took over
  parse to the same values and defaults;
* get_optimizer_param_scheduler (megatron.training.training), handed minitron's validated args:
  the same warm-up, decay and WSD steps, and an OptimizerParamScheduler (megatron.core) that gives
  every param group the same lr and weight decay at every step, for every decay style;
* _get_param_groups with get_standard_config_overrides (megatron.core.optimizer): the same groups
  for --decoupled-lr;
* StepBatchsizeNumMicroBatchesCalculator and Megatron's update_train_iters loop: the same
  batches and the same number of iterations for a --step-batch-size-schedule.

Needs the `mcore` extra (Python >= 3.12); skipped with the reason where megatron.core does not
import. minitron itself never imports megatron.
"""

from __future__ import annotations

import argparse
import socket
import warnings

import pytest
import torch

pytestmark = pytest.mark.mcore
try:
    with warnings.catch_warnings():   # Megatron warns that apex and TE are absent: known, CPU
        warnings.simplefilter("ignore")
        from megatron.core import num_microbatches_calculator as mcore_calc
        from megatron.core.optimizer import OptimizerConfig as McoreOptimizerConfig
        from megatron.core.optimizer import _get_param_groups as mcore_param_groups
        from megatron.core.optimizer import get_standard_config_overrides
        from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler as McoreScheduler
        from megatron.training import global_vars as mcore_global_vars
        from megatron.training.arguments import add_megatron_arguments
        from megatron.training.training import get_optimizer_param_scheduler as mcore_get_scheduler
except ImportError as exc:
    pytest.skip(f"megatron does not import ({exc}): make a Python 3.12 venv and install torch==2.13.0, "
                "then megatron-core==0.19.2 with --no-deps (the mcore extra)", allow_module_level=True)

import minitron.training.model_setup as model_setup
from minitron.core.num_microbatches_calculator import StepBatchsizeNumMicroBatchesCalculator, step_schedule_stretches
from minitron.core.optimizer import OptimizerConfig, _get_param_groups
from minitron.training.arguments import build_parser, validate_args

MODEL = "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --micro-batch-size 1 --mock-data"
FLAGS = ["--lr", "--min-lr", "--lr-decay-style", "--lr-wsd-decay-style", "--lr-decay-iters", "--lr-decay-samples",
         "--lr-wsd-decay-iters", "--lr-wsd-decay-samples", "--lr-warmup-fraction", "--lr-warmup-iters",
         "--lr-warmup-samples", "--lr-warmup-init", "--decoupled-lr", "--decoupled-min-lr", "--train-samples",
         "--step-batch-size-schedule", "--calculate-per-token-loss", "--rampup-batch-size"]
# (world, flags): each a run of its own, iteration- and sample-based, every decay style.
RUNS = {
    "linear-iters": (2, "--train-iters 40 --global-batch-size 4 --lr 1e-3 --min-lr 1e-4 --lr-warmup-iters 5"),
    "cosine-fraction": (1, "--train-iters 30 --global-batch-size 3 --lr 2e-3 --lr-decay-style cosine "
                           "--lr-warmup-fraction 0.13 --lr-decay-iters 25 --lr-warmup-init 1e-4"),
    "isr-samples": (2, "--train-samples 200 --global-batch-size 4 --lr 1e-3 --lr-decay-style inverse-square-root "
                       "--lr-warmup-samples 20 --lr-decay-samples 150"),
    "constant": (1, "--train-iters 10 --lr 1e-3 --lr-decay-style constant --lr-warmup-iters 2"),
    **{f"wsd-{style}": (2, f"--train-samples 240 --global-batch-size 8 --lr 1e-3 --min-lr 1e-5 --lr-decay-style WSD "
                           f"--lr-wsd-decay-style {style} --lr-wsd-decay-samples 96 --lr-warmup-samples 16 "
                           "--decoupled-lr 4e-3 --decoupled-min-lr 4e-5")
       for style in ("exponential", "linear", "cosine", "minus_sqrt")},
    "wsd-iters": (1, "--train-iters 20 --global-batch-size 2 --lr 1e-3 --lr-decay-style WSD --lr-wsd-decay-iters 7 "
                     "--decoupled-lr 2e-3"),
    "step-schedule": (2, "--train-samples 300 --lr 1e-3 --lr-decay-style cosine --lr-warmup-fraction 0.1 "
                         "--step-batch-size-schedule 0:2,400:4,1.6K:8"),
}


def _minitron_args(world: int, flags: str):
    args = build_parser().parse_args(f"{MODEL} {flags}".split())
    args.rank, args.world_size = 0, world
    return validate_args(args, {"tokenizer_type": "NullTokenizer", "vocab_size": 64})


def test_megatron_parses_the_flags_to_the_same_values():
    theirs = argparse.ArgumentParser(allow_abbrev=False)
    add_megatron_arguments(theirs)
    ours = build_parser()
    for _, flags in RUNS.values():
        argv = f"{MODEL} {flags}".split()
        mine, megatron = ours.parse_args(argv), theirs.parse_known_args(argv)[0]
        for flag in FLAGS:
            dest = flag[2:].replace("-", "_")
            assert getattr(mine, dest) == getattr(megatron, dest), (flag, flags)


class _Groups:
    def __init__(self, groups):
        self.param_groups = groups


def _groups():
    """Three kinds of group: with weight decay, without (wd_mult 0), and --decoupled-lr's."""
    return [{"wd_mult": 1.0, "default_config": True}, {"wd_mult": 0.0, "default_config": True},
            {"wd_mult": 1.0, "max_lr": 4e-3, "min_lr": 4e-5, "default_config": False}]


def _megatron_view(args):
    """Megatron's args for get_optimizer_param_scheduler: minitron's, plus what Megatron's
    validate_args fills in for weight decay (start = end = --weight-decay, constant). A
    sample-based run has no train_iters yet there (Megatron's update_train_iters sets it
    inside get_optimizer_param_scheduler; minitron's validate_args did so before launch)."""
    view = argparse.Namespace(**vars(args))
    if args.train_samples:
        view.train_iters = None
    view.start_weight_decay = view.end_weight_decay = args.weight_decay
    view.weight_decay_incr_style = "constant"
    view.use_checkpoint_opt_param_scheduler, view.override_opt_param_scheduler = False, False
    return view


@pytest.mark.parametrize("name", list(RUNS))
def test_the_schedule_is_megatrons(monkeypatch, name):
    world, flags = RUNS[name]
    args = _minitron_args(world, flags)
    monkeypatch.setattr(model_setup, "get_args", lambda: args)
    mine = model_setup.get_optimizer_param_scheduler(_Groups(_groups()))
    view = _megatron_view(args)
    monkeypatch.setattr(mcore_global_vars, "_GLOBAL_ARGS", view)
    # Megatron counts a step schedule's iterations with its installed calculator.
    mcore_calc.init_num_microbatches_calculator(1, None, args.global_batch_size, args.micro_batch_size,
                                                args.data_parallel_size, False, args.step_batch_size_schedule,
                                                args.seq_length)
    try:
        theirs = mcore_get_scheduler(_Groups(_groups()))
    finally:
        mcore_calc.destroy_num_microbatches_calculator()
    assert isinstance(theirs, McoreScheduler)
    assert view.train_iters == args.train_iters   # the run's length, as Megatron counts it
    for field in ("init_lr", "max_lr", "min_lr", "lr_warmup_steps", "lr_decay_steps", "lr_decay_style",
                  "wsd_decay_steps", "lr_wsd_decay_style", "start_wd", "end_wd", "wd_incr_steps", "wd_incr_style"):
        assert getattr(mine, field) == getattr(theirs, field), field
    batch = args.global_batch_size
    for _ in range(args.train_iters + 3):   # and a little past the end
        mine.step(batch)
        theirs.step(batch)
        for a, b in zip(mine.optimizer.param_groups, theirs.optimizer.param_groups):
            assert a["lr"] == pytest.approx(b["lr"], rel=1e-12, abs=0)
            assert a["weight_decay"] == b["weight_decay"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def world_of_one():
    """Megatron's _get_param_groups aligns the groups of all ranks (all_gather_object)."""
    torch.distributed.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1)
    yield
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("decoupled", [(None, None), (5e-3, None), (5e-3, 5e-4)])
def test_decoupled_lr_groups_are_megatrons(world_of_one, decoupled):
    model = torch.nn.Module()
    model.embedding = torch.nn.Parameter(torch.zeros(8, 4))
    model.dense = torch.nn.Linear(4, 4)
    model.norm = torch.nn.LayerNorm(4)
    model.output = torch.nn.Parameter(torch.zeros(8, 4))
    model.embedding.is_embedding_or_output_parameter = model.output.is_embedding_or_output_parameter = True
    lr, min_lr = 1e-3, 1e-4
    config = McoreOptimizerConfig(lr=lr, min_lr=min_lr, decoupled_lr=decoupled[0], decoupled_min_lr=decoupled[1])
    theirs = mcore_param_groups([model], config, get_standard_config_overrides(config))
    mine = _get_param_groups([model], OptimizerConfig(lr=lr, min_lr=min_lr, decoupled_lr=decoupled[0],
                                                      decoupled_min_lr=decoupled[1]))
    keys = ("wd_mult", "max_lr", "min_lr", "default_config")
    assert [([id(p) for p in g["params"]], [g[k] for k in keys]) for g in mine] == \
           [([id(p) for p in g["params"]], [g[k] for k in keys]) for g in theirs]


@pytest.mark.parametrize("schedule, seq_length", [
    ("0:2 400:4 1.6K:8", 16), ("0:768 250B:1536 500B:3072 750B:6144", 2048), ("0:4,100:8,250:16", None),
    ("300:8 0:4", 16)])
def test_step_schedule_is_megatrons(schedule, seq_length):
    micro, dp = 1, 2
    mine = StepBatchsizeNumMicroBatchesCalculator(micro, dp, False, 0, schedule, seq_length)
    theirs = mcore_calc.StepBatchsizeNumMicroBatchesCalculator(micro, dp, False, 1, schedule, seq_length)
    assert mine.schedule == theirs.schedule and mine.global_batch_size == theirs.global_batch_size
    for threshold, _ in theirs.schedule:
        for consumed in (threshold - 1, threshold, threshold + 1):
            mine.update(max(consumed, 0), False)
            theirs.update(max(consumed, 0), False)
            assert (mine.get(), mine.get_current_global_batch_size()) == \
                   (theirs.get(), theirs.get_current_global_batch_size())
    # Megatron's update_train_iters (training.py) with Megatron's calculator, against the walk
    # minitron's validate_args does before launch.
    train_samples = min(theirs.schedule[-1][0] + 3 * theirs.global_batch_size + 1, 50_000)
    iterations, consumed = 0, 0
    while consumed < train_samples:
        theirs.update(consumed, consistency_check=False)
        consumed += theirs.get_current_global_batch_size()
        iterations += 1
    stretches, walked = step_schedule_stretches(micro, dp, schedule, seq_length, train_samples)
    assert (sum(n for _, n in stretches), walked) == (iterations, consumed)
