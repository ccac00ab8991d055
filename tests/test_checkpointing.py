"""Stop, save, resume: the resumed run repeats the uninterrupted one bit for bit.

Layout pp 2 x dp 2 with the distributed optimizer, so a checkpoint holds per-stage model files
and per-data-parallel-rank optimizer shards. The stop is Megatron's --exit-interval. The resume
also meets a later save that died half-way (its directory there, the tracker never moved), as a
job killed while saving leaves it.
"""

import os
import json
from pathlib import Path

import pytest

from minitron.launcher import LaunchConfig, RankFailure, Target, launch
from minitron.training.checkpointing import TRACKER, iteration_dir
from cli_here import run_minitron

FLAGS = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "4", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0.1", "--seed", "3",
         "--pipeline-model-parallel-size", "2", "--use-distributed-optimizer", "--distributed-backend", "gloo",
         "--ckpt-format", "torch"]   # the legacy format: one file per rank (test_dist_ckpt*.py: torch_dist)
# A global batch of 4 is two micro-batches per data-parallel rank: pp 2's 1F1B schedule still has a
# warm-up, a steady step and a cool-down to resume through.


def train(out: Path, *extra) -> list[dict]:
    out.mkdir(parents=True, exist_ok=True)
    argv = FLAGS + ["--log-jsonl", str(out / "it.jsonl"), *extra]
    try:
        launch(LaunchConfig(world_size=4, log_dir=out / "logs"), Target(module="minitron.pretrain_gpt", argv=argv))
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None
    return [json.loads(line) for line in open(out / "it.jsonl")]


def break_a_later_save(ck: Path) -> Path:
    """A save of iteration 4 that died half-way: its directory exists, the marker never moved."""
    broken = iteration_dir(ck, 4) / "mp_rank_00_000"
    broken.mkdir(parents=True)
    (broken / "model_optim_rng.pt.tmp").write_bytes(b"partial")
    return broken


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The uninterrupted run, the run stopped and saved at iteration 2, and its resume, which
    finds the broken save of iteration 4 beside iteration 2's (one resume checks both)."""
    tmp = tmp_path_factory.mktemp("ckpt")
    full = train(tmp / "full")
    first = train(tmp / "first", "--exit-interval", "2", "--save", str(tmp / "ck"))
    broken = break_a_later_save(tmp / "ck")
    second = train(tmp / "second", "--load", str(tmp / "ck"))
    return tmp, full, first, second, broken


def test_resume_repeats_the_uninterrupted_run_exactly(runs):
    _, full, first, second, _ = runs
    assert [r["iteration"] for r in first] == [1, 2]
    assert [r["iteration"] for r in second] == [3, 4]
    # Dropout is on: the RNG streams, data order, optimizer state and schedule all resumed.
    for a, b in zip(full, first + second):
        assert (a["lm_loss"], a["lr"], a["grad_norm"]) == (b["lm_loss"], b["lr"], b["grad_norm"])


def test_checkpoint_layout(runs):
    tmp = runs[0]
    ck = tmp / "ck"
    assert (ck / TRACKER).read_text() == "2"
    it = iteration_dir(ck, 2)
    assert sorted(p.name for p in it.iterdir()) == ["metadata.json", "mp_rank_00_000", "mp_rank_00_001"]
    assert sorted(p.name for p in (it / "mp_rank_00_001").iterdir()) == [
        "distrib_optim_dp000.pt", "distrib_optim_dp001.pt", "model_optim_rng.pt"]


def _minitron(*args):
    # In this process: the refusal comes before any rank starts (the executable's own pretrain
    # runs are test_throughput_log.py's and test_hang_quiet.py's)
    return run_minitron(*args, env=dict(os.environ), here=True)


def test_other_layout_is_refused_before_any_rank_starts(runs, tmp_path):
    ck = runs[0] / "ck"
    argv = [a for a in FLAGS if a != "--use-distributed-optimizer"]
    i = argv.index("--pipeline-model-parallel-size")
    argv[i + 1] = "4"
    done = _minitron("pretrain", "--world", "4", "--log-dir", str(tmp_path / "logs"), *argv, "--load", str(ck))
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "pipeline-model-parallel-size 2" in done.stderr
    assert not (tmp_path / "logs").exists()


def test_an_interrupted_save_leaves_the_previous_checkpoint_latest(runs):
    tmp, full, _, second, broken = runs
    assert (tmp / "ck" / TRACKER).read_text() == "2" and (broken / "model_optim_rng.pt.tmp").exists()
    # The resume loaded iteration 2, not the half-written 4, and went on from there.
    assert [r["iteration"] for r in second] == [3, 4]
    assert second[0]["lm_loss"] == full[2]["lm_loss"]
