"""`pretrain --deepspeed`: the GPT trained through the engine (minitron/training/deepspeed_training.py)
at ZeRO 1, 2 and 3 on 2 and 4 data-parallel ranks, and with tensor parallel 2, loses what the
serial Megatron run loses, iteration by iteration (dropout off); and what the ds_config and the
flags disagree on is refused in one line before any rank starts.

The GPT ties its embedding and output weights (the default), which ZeRO-3 must gather for a
module that does not own it (register_external_parameter)."""

import json
import os
from pathlib import Path

import pytest

from distributed import pretrain_records, pretrain_records_each
from cli_here import run_minitron

ITERS = 2
MODEL = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", str(ITERS), "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo"]
# Megatron's --clip-grad (1.0 by default) is not read on the engine's path: the config clips.
DS_CONFIG = {"train_batch_size": 4, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0}


def write_config(path: Path, stage: int, **extra) -> Path:
    # Stage 2 reduces gradients in buckets during backward: these make about four per backward.
    zero = {"stage": stage, "reduce_bucket_size": 20000}
    path.write_text(json.dumps({**DS_CONFIG, "zero_optimization": zero, **extra}))
    return path


def run(out: Path, world: int, *flags):
    return pretrain_records(out, world, [*MODEL, *flags])


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return run(tmp_path_factory.mktemp("serial") / "run", 1)


LAYOUTS = {   # name: (world, ZeRO stage, extra flags)
    "zero1-dp2": (2, 1, []), "zero2-dp2": (2, 2, []), "zero3-dp2": (2, 3, []),
    "zero1-dp4": (4, 1, []), "zero2-dp4": (4, 2, []), "zero3-dp4": (4, 3, []),
    "zero3-tp2-dp2": (4, 3, ["--tensor-model-parallel-size", "2"]),
}


@pytest.fixture(scope="module")
def engine_runs(tmp_path_factory):
    """Every layout's iterations.jsonl records, by name: one launch per world size, whose ranks
    run pretrain once per layout (tests/distributed.py pretrain_records_each)."""
    root, runs = tmp_path_factory.mktemp("engine"), {}
    for world in sorted({w for w, _, _ in LAYOUTS.values()}):
        argvs = {name: [*MODEL, *flags, "--deepspeed", "--deepspeed-config",
                        str(write_config(root / f"{name}.json", stage))]
                 for name, (w, stage, flags) in LAYOUTS.items() if w == world}
        runs.update(pretrain_records_each(root / f"world{world}", world, argvs))
    return runs


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_engine_matches_serial(engine_runs, serial, name):
    records = engine_runs[name]
    losses = [r["lm_loss"] for r in records]
    expected = [r["lm_loss"] for r in serial]
    assert losses == pytest.approx(expected, abs=1e-5), f"{name}: {losses} vs serial {expected}"
    assert [r["grad_norm"] for r in records] == pytest.approx([r["grad_norm"] for r in serial], rel=1e-4)
    assert [r["lr"] for r in records] == pytest.approx([r["lr"] for r in serial])
    assert losses[-1] != losses[0]   # the weights moved




def refusal(tmp_path, world: int, *flags) -> str:
    """The one line `minitron pretrain` prints, having checked that it exits 2 and starts nothing.
    Its entry point in this process: a refusal starts no rank, and the executable's own refusals
    are held in tests/test_bad_inputs_flags.py."""
    logs = tmp_path / "logs"
    done = run_minitron("pretrain", "--world", str(world), "--log-dir", str(logs), *MODEL, *flags,
                        env={**os.environ, "COLUMNS": "300"}, here=True)
    assert done.returncode == 2, done.stdout + done.stderr
    assert not logs.exists()
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_triad_disagreement_is_refused_with_both_numbers(tmp_path):
    config = write_config(tmp_path / "ds.json", 1)
    line = refusal(tmp_path, 2, "--global-batch-size", "16", "--deepspeed", "--deepspeed-config", str(config))
    assert "train_batch_size is 4 but --global-batch-size is 16" in line and "data-parallel size 2" in line


def test_refusals_before_any_rank(tmp_path):
    """The same checks as validate_args runs them (no process): one line each."""
    from minitron.cli.common import UserError, validate_pretrain

    z1 = str(write_config(tmp_path / "z1.json", 1))
    z1_fp16 = str(write_config(tmp_path / "z1fp16.json", 1, fp16={"enabled": True}))
    only_train = tmp_path / "train.json"
    only_train.write_text(json.dumps({"train_batch_size": 8}))   # at dp 4: micro 2
    opt = str(write_config(tmp_path / "opt.json", 1, optimizer={"type": "Adam", "params": {"lr": 1e-3}}))
    cases = [   # (world, flags, words the line must hold)
        (4, ["--num-layers", "2", "--pipeline-model-parallel-size", "2", "--tensor-model-parallel-size", "2",
             "--deepspeed", "--deepspeed-config", z1], "PipelineModule GPT has no tensor-parallel layers"),
        (2, ["--num-layers", "2", "--pipeline-model-parallel-size", "2", "--deepspeed", "--deepspeed-config",
             str(write_config(tmp_path / "z2.json", 2))], "PipelineEngine runs ZeRO stage 0 or 1 only"),
        (2, ["--num-layers", "2", "--pipeline-model-parallel-size", "2", "--save", str(tmp_path / "ck"),
             "--deepspeed", "--deepspeed-config", z1], "per-layer checkpoint files are not built"),
        (2, ["--num-layers", "4", "--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage",
             "1", "--deepspeed", "--deepspeed-config", z1], "TrainSchedule has one chunk per stage"),
        (2, ["--num-layers", "2", "--pipeline-model-parallel-size", "2", "--position-embedding-type", "rope",
             "--deepspeed", "--deepspeed-config", z1], "learned absolute positions only"),
        (2, ["--micro-batch-size", "2", "--deepspeed", "--deepspeed-config", z1],
         "train_micro_batch_size_per_gpu is 1 but --micro-batch-size is 2"),
        (4, ["--deepspeed", "--deepspeed-config", str(only_train)], "train_micro_batch_size_per_gpu is 2 but --micro-batch-size is 1"),
        (2, ["--deepspeed"], "--deepspeed needs --deepspeed-config"),
        (2, ["--deepspeed-config", z1], "read only with --deepspeed"),
        (2, ["--deepspeed", "--deepspeed-config", str(tmp_path / "none.json")], "no such file"),
        (2, ["--fp16", "--deepspeed", "--deepspeed-config", z1], "does not enable fp16 but --fp16 is given"),
        (2, ["--deepspeed", "--deepspeed-config", z1_fp16], "enables fp16 but --fp16 is not given"),
        (2, ["--deepspeed", "--deepspeed-config", opt], "section 'optimizer'"),
        (2, ["--use-distributed-optimizer", "--deepspeed", "--deepspeed-config", z1], "ZeRO partitions"),
    ]
    for world, flags, words in cases:
        with pytest.raises(UserError) as refused:
            validate_pretrain(MODEL + flags, world)
        line = str(refused.value)
        assert words in line and "\n" not in line, (flags, line)
