"""Hybrid models: the pattern, its flags, and every parallel layout training the serial model.

A small Nemotron-H-shaped model (Mamba, attention and MLP layers, RMSNorm, no biases, no
positions) trains 3 iterations on forked gloo ranks through pretrain_hybrid; tensor
parallelism with sequence parallelism (Mamba heads and groups split), a pipeline cut by '|',
and both at once must log the serial run's losses within 1e-5 (fp32; only the order of the
sums differs). The vocabulary (255 + EOD = 256) pads alike at tp 1 and 2, and dropout is off,
so the layouts compute one model.
"""

from __future__ import annotations

import json

import pytest

from minitron.core.ssm.mamba_hybrid_layer_allocation import (
    check_hybrid_pattern, get_hybrid_layer_counts, select_pipeline_segment)
from minitron.launcher import LaunchConfig, RankFailure, Target, launch, session_env
from minitron.training.arguments import GPT_ARGS_DEFAULTS, ArgumentError, megatron_parser, validate_args

MODEL = ["--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16", "--max-position-embeddings", "16",
         "--mamba-head-dim", "8", "--mamba-num-groups", "2", "--mamba-state-dim", "8", "--normalization", "RMSNorm",
         "--disable-bias-linear", "--position-embedding-type", "none", "--vocab-size", "255",
         "--hidden-dropout", "0", "--attention-dropout", "0"]
RUN = ["--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "3", "--lr", "1e-3", "--mock-data",
       "--distributed-backend", "gloo"]


def _validated(argv, world=1):
    args = megatron_parser().parse_args([*MODEL, *RUN, *argv])
    args.world_size, args.rank, args.local_rank = world, 0, 0
    return validate_args(args, GPT_ARGS_DEFAULTS)


def test_pipeline_segments_as_megatron_selects_them():
    # '|' segments dealt round-robin over pp ranks (chunk v of rank r is segment v * pp + r)
    assert select_pipeline_segment("M*|-M-|M|*E", pp_rank=1, pp_size=2, vp_stage=1) == ("*E", 6)
    assert select_pipeline_segment("M*|-M-|M|*E", pp_rank=0, pp_size=2, vp_stage=1) == ("M", 5)
    assert select_pipeline_segment("M*-M", pp_rank=1, pp_size=2) == ("-M", 2)   # no pipes: even runs
    with pytest.raises(ValueError, match="do not split evenly"):
        select_pipeline_segment("M*-", pp_rank=0, pp_size=2)
    assert get_hybrid_layer_counts("M-M*|-E") == {"M": 2, "*": 1, "-": 2, "E": 1}


@pytest.mark.parametrize("pattern,fragment", [("M*X", "'X' is not a layer symbol"), ("M*G", "gated delta net"),
                                              ("M*||M", "empty pipeline segment"), ("M*/MM", "multi-token")])
def test_bad_patterns_are_named(pattern, fragment):
    assert fragment in check_hybrid_pattern(pattern)


def test_the_pattern_sets_num_layers_and_the_virtual_pipeline():
    args = _validated(["--hybrid-override-pattern", "M*|-M|M|*-", "--num-layers", "99",
                       "--pipeline-model-parallel-size", "2"], world=2)
    assert (args.hybrid_layer_pattern, args.num_layers, args.virtual_pipeline_model_parallel_size) == \
        ("M*|-M|M|*-", 7, 2)


@pytest.mark.parametrize("argv,fragment", [
    (["--hybrid-layer-pattern", "M*-", "--tensor-model-parallel-size", "4"], "--mamba-num-groups 2 is not divisible"),
    (["--hybrid-layer-pattern", "M*|-", "--pipeline-model-parallel-size", "4"], "not a multiple of"),
    (["--hybrid-layer-pattern", "M*-", "--spec", "my.module", "my_spec"], "does not name Megatron's hybrid stack"),
    (["--hybrid-layer-pattern", "ME"], "give --num-experts"),
    (["--hybrid-layer-pattern", "M*", "--context-parallel-size", "2"], "does not split a scan"),
    (["--hybrid-layer-pattern", "M*", "--hybrid-override-pattern", "M*"], "cannot both be given"),
    (["--num-layers", "2", "--export-model-type", "HybridModel"], "give its layers with --hybrid-layer-pattern"),
    (["--num-layers", "2", "--is-hybrid-model"], "--is-hybrid-model describes a hybrid model"),
])
def test_bad_hybrid_flags_get_one_line(argv, fragment):
    world = 4 if "4" in argv else 2 if "2" in argv else 1
    with pytest.raises(ArgumentError, match=fragment) as info:
        _validated(argv, world)
    assert "\n" not in str(info.value)


def _losses(tmp_path, name, world, argv):
    out = tmp_path / name
    out.mkdir()
    argv = [*MODEL, *RUN, *argv, "--log-jsonl", str(out / "iterations.jsonl")]
    try:
        launch(LaunchConfig(world_size=world, log_dir=out / "logs", env=session_env(world, None)),
               Target(module="minitron.pretrain_hybrid", argv=argv))
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None
    return [json.loads(line)["lm_loss"] for line in open(out / "iterations.jsonl")]


LAYOUTS = {   # name: (world, flags); the pattern is Nemotron-H's block, shortened
    "tp2 + sequence parallel": (2, ["--hybrid-layer-pattern", "M*-M", "--tensor-model-parallel-size", "2",
                                    "--sequence-parallel"]),
    "pp2, cut by '|'": (2, ["--hybrid-layer-pattern", "M*|-M", "--pipeline-model-parallel-size", "2"]),
    "tp2 x pp2, uneven cut": (4, ["--hybrid-layer-pattern", "M*-|M", "--pipeline-model-parallel-size", "2",
                                  "--tensor-model-parallel-size", "2"]),
}
STRESS = {"tp2 x pp2, uneven cut"}   # four ranks: the two above already cover each split


@pytest.fixture(scope="module")
def serial_losses(tmp_path_factory):
    return _losses(tmp_path_factory.mktemp("serial"), "serial", 1, ["--hybrid-layer-pattern", "M*-M"])


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.stress) if n in STRESS else n for n in LAYOUTS])
def test_parallel_layouts_train_the_serial_model(tmp_path, serial_losses, name):
    world, argv = LAYOUTS[name]
    losses = _losses(tmp_path, "run", world, argv)
    assert len(losses) == len(serial_losses) == 3
    diff = max(abs(a - b) for a, b in zip(losses, serial_losses))
    assert diff <= 1e-5, f"{name}: losses {losses} differ from the serial run's {serial_losses} by {diff:.1e}"


@pytest.mark.stress
def test_a_tp2_checkpoint_resumes_at_pp2_on_the_serial_path(tmp_path):
    """torch_dist keys each section of in_proj and the conv on its own (core/ssm/mamba_checkpoint.py),
    so a checkpoint written at tp 2 loads at tp 1 and goes on as the serial run goes on."""
    schedule = ["--train-iters", "4", "--lr-decay-iters", "4"]
    serial = _losses(tmp_path, "serial", 1, ["--hybrid-layer-pattern", "M*-M", *schedule])
    ckpt = str(tmp_path / "ckpt")
    _losses(tmp_path, "tp2", 2, ["--hybrid-layer-pattern", "M*-M", "--tensor-model-parallel-size", "2",
                                 "--sequence-parallel", *schedule, "--exit-interval", "2", "--save", ckpt,
                                 "--save-interval", "2"])
    resumed = _losses(tmp_path, "pp2", 2, ["--hybrid-layer-pattern", "M*-|M", "--pipeline-model-parallel-size", "2",
                                           *schedule, "--load", ckpt])
    assert len(resumed) == 2 and max(abs(a - b) for a, b in zip(resumed, serial[2:])) <= 1e-5, (resumed, serial)
