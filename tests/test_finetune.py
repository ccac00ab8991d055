"""Megatron's --finetune: --load reads the weights only, and the run starts again at iteration 0.

One tiny serial model trained two iterations and saved; then trained again from that checkpoint
with --finetune: the iterations count from 1, the learning-rate schedule (warmup, then decay) and
the data order are a fresh run's, but the losses are those of the trained weights.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from minitron.launcher import LaunchConfig, RankFailure, Target, launch
from minitron.training.arguments import GPT_ARGS_DEFAULTS, megatron_parser, validate_args

FLAGS = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
         "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-2",
         "--lr-warmup-iters", "1", "--lr-decay-style", "linear", "--min-lr", "1e-3", "--mock-data",
         "--vocab-size", "63", "--make-vocab-size-divisible-by", "16", "--seed", "5", "--distributed-backend", "gloo",
         "--hidden-dropout", "0", "--attention-dropout", "0"]


def train(out: Path, *extra) -> list[dict]:
    out.mkdir(parents=True)
    argv = FLAGS + ["--log-jsonl", str(out / "it.jsonl"), *extra]
    try:
        launch(LaunchConfig(world_size=1, log_dir=out / "logs"), Target(module="minitron.pretrain_gpt", argv=argv))
    except RankFailure as failure:
        raise AssertionError(f"{failure}\n{failure.log_tail(30)}") from None
    return [json.loads(line) for line in open(out / "it.jsonl")]


# the legacy format (one file per rank) reads --finetune through the same reset: a stress-run case
@pytest.mark.parametrize("ckpt_format", ["torch_dist", pytest.param("torch", marks=pytest.mark.stress)])
def test_finetune_loads_the_weights_and_starts_at_iteration_zero(tmp_path, ckpt_format):
    first = train(tmp_path / "first", "--save", str(tmp_path / "ck"), "--ckpt-format", ckpt_format)
    tuned = train(tmp_path / "tuned", "--load", str(tmp_path / "ck"), "--finetune")
    assert [r["iteration"] for r in tuned] == [1, 2]                 # not 3, 4: iteration 0 again
    assert [r["lr"] for r in tuned] == [r["lr"] for r in first]     # a fresh schedule
    # The same first batch (no samples consumed) on the trained weights: a lower loss than the
    # untrained model's on it. Without the weights the two first losses would be equal.
    assert tuned[0]["lm_loss"] < first[0]["lm_loss"]


def _validated(*extra):
    args = megatron_parser().parse_args(["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2",
                                         "--seq-length", "8", "--micro-batch-size", "1", *extra])
    args.rank, args.world_size, args.distributed_backend = 0, 1, "gloo"
    return validate_args(args, dict(GPT_ARGS_DEFAULTS))


def test_finetune_reads_neither_optimizer_nor_random_states():
    args = _validated("--finetune")
    assert args.finetune and args.no_load_optim and args.no_load_rng
    plain = _validated()
    assert not (plain.finetune or plain.no_load_optim or plain.no_load_rng)
