"""parse_args / validate_args: torch-free validation, sample-based training, Megatron's flag names."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from minitron.core.num_microbatches_calculator import _build_num_microbatches_calculator
from minitron.training.arguments import ArgumentError, build_parser, validate_args

from cli_here import MINITRON

ROOT = Path(__file__).resolve().parents[1]
MODEL = ["--num-layers", "4", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
         "--distributed-backend", "gloo", "--tokenizer-type", "NullTokenizer", "--vocab-size", "64"]
ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def validated(world: int, *flags: str):
    args = build_parser().parse_args(MODEL + list(flags))
    args.world_size, args.rank = world, 0
    return validate_args(args)


def test_refusals_never_import_torch():
    # A fresh interpreter: this one has torch loaded already (conftest).
    probe = """
import sys
from minitron.cli.common import UserError, validate_pretrain
model = "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 8 --micro-batch-size 1".split()
for world, flags in [(8, "--tensor-model-parallel-size 3"), (2, "--global-batch-size 7"),
                     (2, "--train-iters 2 --mock-data --lr nan"), (8, "--expert-model-parallel-size 2")]:
    try:
        validate_pretrain(model + flags.split() + ["--distributed-backend", "gloo"], world)
        print("accepted", flags)
    except UserError:
        pass
print(sorted(m for m in ("torch", "numpy") if m in sys.modules))
"""
    run = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=ENV, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", run.stdout


def test_the_cli_refuses_before_importing_torch():
    # The whole path: `minitron` entry -> parse -> validate -> the one line, as -X importtime sees it.
    run = subprocess.run([sys.executable, "-X", "importtime", MINITRON, "pretrain", "--world", "8",
                          "--backend", "gloo", "--tensor-model-parallel-size", "3", *MODEL[:8],
                          "--micro-batch-size", "1"], capture_output=True, text=True, env=ENV, timeout=120)
    assert run.returncode == 2, run.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "numpy" not in imported
    assert "minitron.training.arguments" in imported  # the validation did run in this process


def megatron_update_train_iters(train_samples, rampup, global_batch, micro, dp):
    """Megatron's update_train_iters, iteration by iteration, as the reference."""
    if rampup is None:
        return train_samples // global_batch
    calc = _build_num_microbatches_calculator(0, rampup, global_batch, micro, dp)
    iterations = consumed = 0
    while consumed <= rampup[2] and consumed <= train_samples:
        calc.update(consumed, consistency_check=False)
        consumed += calc.get_current_global_batch_size()
        iterations += 1
    return iterations + max(train_samples - consumed, 0) // global_batch


@pytest.mark.parametrize("samples,rampup,gbs", [
    (64, None, 16), (1000, None, 24), (64, [8, 4, 8], 16), (640, [8, 8, 100], 32),
    (5000, [8, 8, 3000], 64), (100, [8, 8, 3000], 64), (977, [16, 16, 977], 128),
])
def test_train_samples_gives_megatrons_iterations(samples, rampup, gbs):
    flags = ["--micro-batch-size", "1", "--global-batch-size", str(gbs), "--train-samples", str(samples),
             "--lr", "1e-3", "--mock-data"]
    if rampup:
        flags += ["--rampup-batch-size", *map(str, rampup)]
    args = validated(8, *flags)
    assert args.train_iters == megatron_update_train_iters(samples, rampup, gbs, 1, 8)


def test_megatron_flag_names_and_defaults():
    new = validated(4, "--micro-batch-size", "1", "--pipeline-model-parallel-size", "2",
                    "--num-virtual-stages-per-pipeline-rank", "2")
    old = validated(4, "--micro-batch-size", "1", "--pipeline-model-parallel-size", "2",
                    "--virtual-pipeline-model-parallel-size", "2")
    assert new.virtual_pipeline_model_parallel_size == old.virtual_pipeline_model_parallel_size == 2
    assert new.eval_iters == 100 and new.eval_interval is None  # Megatron's defaults
    with pytest.raises(ArgumentError, match="add --num-experts"):
        validated(2, "--micro-batch-size", "1", "--expert-model-parallel-size", "2")
    assert validated(2, "--micro-batch-size", "1", "--expert-model-parallel-size", "2",
                     "--num-experts", "4").num_experts == 4
