"""--eval-global-batch-size and --eval-micro-batch-size (Megatron's): the evaluation reads its own
batch, in its own micro-batches, whatever the training's are."""

from __future__ import annotations

import re

import pytest

from distributed import pretrain_records
from minitron.training.argument_groups import ArgumentError
from minitron.training.arguments import GPT_ARGS_DEFAULTS, megatron_parser, validate_args
from minitron.training.data import get_train_valid_test_num_samples

FLAGS = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
         "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2", "--lr", "1e-3",
         "--eval-interval", "2", "--eval-iters", "1", "--mock-data", "--vocab-size", "63",
         "--make-vocab-size-divisible-by", "16", "--seed", "3", "--distributed-backend", "gloo",
         "--hidden-dropout", "0", "--attention-dropout", "0"]


def _validated(*extra, world=1):
    args = megatron_parser().parse_args([*FLAGS, *extra])
    args.rank, args.world_size = 0, world
    return validate_args(args, dict(GPT_ARGS_DEFAULTS))


def test_defaults_rule_and_sample_counts():
    args = _validated()
    assert (args.eval_global_batch_size, args.eval_micro_batch_size) == (2, 1)   # the training's
    args = _validated("--eval-global-batch-size", "6", "--eval-micro-batch-size", "3")
    # (2 evaluations: the one at iteration 2 and Megatron's at the end) x 1 iteration x 6 samples
    assert get_train_valid_test_num_samples(args) == (4, 12, 6)
    with pytest.raises(ArgumentError, match=r"^--eval-global-batch-size 6 is not divisible by "
                                            r"--eval-micro-batch-size 2 x data-parallel size 2"):
        _validated("--eval-global-batch-size", "6", "--eval-micro-batch-size", "2", world=2)


def _validation_loss(out) -> float:
    text = (out / "logs" / "rank0.log").read_text()
    return float(re.search(r"validation loss at iteration 2 \| lm loss value: (\S+)", text).group(1))


@pytest.mark.stress   # three serial runs, ~5 s of CPU
def test_the_evaluation_reads_its_own_batch(tmp_path):
    losses = {}
    for name, extra in {"default": [], "whole": ["--eval-global-batch-size", "4", "--eval-micro-batch-size", "4"],
                        "split": ["--eval-global-batch-size", "4", "--eval-micro-batch-size", "1"]}.items():
        train = pretrain_records(tmp_path / name, 1, FLAGS + extra)
        losses[name] = _validation_loss(tmp_path / name)
        assert [r["iteration"] for r in train] == [1, 2]
    assert losses["whole"] == pytest.approx(losses["split"], rel=1e-6)   # the same 4 samples, cut otherwise
    assert losses["whole"] != pytest.approx(losses["default"], rel=1e-6)  # 4 samples, not the training's 2
