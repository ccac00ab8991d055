"""--calculate-per-token-loss: the global batch's summed token losses over its token count.

With --eod-mask-loss the micro-batches hold different numbers of loss tokens, so the default
(a mean of micro-batch means, averaged over dp) and the per-token loss train differently; the
per-token one must train the same on every layout, because the count that divides the
gradients is summed over the micro-batches, broadcast over the pipeline and all-reduced over dp.
"""

from types import SimpleNamespace

import pytest
import torch

from distributed import pretrain_records
from minitron.core.pipeline_parallel.schedules import forward_step_calc_loss

MODEL = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "2", "--lr", "1e-2",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--eod-mask-loss"]
PER_TOKEN = "--calculate-per-token-loss"


def _run(tmp_path_factory, name, world, *flags):
    records = pretrain_records(tmp_path_factory.mktemp(name) / "run", world, [*MODEL, *flags])
    return [(r["lm_loss"], r["grad_norm"]) for r in records]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return _run(tmp_path_factory, "serial", 1, PER_TOKEN)


def test_loss_is_the_sum_and_its_token_count_comes_back():
    """The schedule's side, without ranks: the sum is kept (finalize divides), or divided now."""
    def loss_func(_):
        return torch.tensor(6.0), torch.tensor(3, dtype=torch.int), {"lm loss": torch.tensor([6.0, 3.0])}
    for per_token, expected in ((True, 6.0), (False, 6.0 / 3 / 4)):
        config = SimpleNamespace(calculate_per_token_loss=per_token)
        loss, num_tokens = forward_step_calc_loss(None, loss_func, config, None, 4, [], cp_group_size=1,
                                                  is_last_stage=True)
        assert (loss.item(), num_tokens.item()) == (expected, 3)
    _, none = forward_step_calc_loss(None, loss_func, config, None, 4, [], cp_group_size=1, is_last_stage=False)
    assert none.item() == 0   # a stage without the loss counts no tokens


def test_the_flag_reaches_the_schedules():
    """--calculate-per-token-loss -> args -> TransformerConfig, which the schedules read."""
    from minitron.training.arguments import build_parser, core_transformer_config_from_args, validate_args

    args = build_parser().parse_args([*MODEL, PER_TOKEN])
    args.rank, args.world_size = 0, 1
    validate_args(args, {"tokenizer_type": "NullTokenizer"})
    assert core_transformer_config_from_args(args).calculate_per_token_loss


@pytest.mark.stress   # a third run: with the stress tests, to keep the default run's budget
def test_per_token_differs_from_the_mean_of_means(tmp_path_factory, serial):
    mean = _run(tmp_path_factory, "mean", 1)
    assert mean[0][0] == serial[0][0]   # the same first batch, and the logged loss is token-weighted in both
    # ... but a different update: the second step's gradient is another one.
    assert mean[1][1] != pytest.approx(serial[1][1], rel=1e-3)


LAYOUTS = {
    "pp2-dp2": (4, ["--pipeline-model-parallel-size", "2"]),
    "tp2-pp2-dp2": (8, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
    "pp2-vp2-dp2": (4, ["--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2"]),
    "tp2-dp2-distopt": (4, ["--tensor-model-parallel-size", "2", "--use-distributed-optimizer"]),
    # Context parallelism: each cp rank holds part of every sequence, so part of its loss tokens.
    "tp2-cp2-sp": (4, ["--tensor-model-parallel-size", "2", "--context-parallel-size", "2", "--sequence-parallel"]),
}
# One layout in the default run (pipeline and data parallel: where the token count travels); the
# others with the stress tests, to keep the default run's budget.
CHEAP = {"pp2-dp2"}


@pytest.mark.parametrize("name", [n if n in CHEAP else pytest.param(n, marks=pytest.mark.stress) for n in LAYOUTS])
def test_layout_matches_serial(tmp_path_factory, serial, name):
    world, flags = LAYOUTS[name]
    records = _run(tmp_path_factory, name, world, PER_TOKEN, *flags)
    assert [loss for loss, _ in records] == pytest.approx([loss for loss, _ in serial], rel=1e-5)
    assert [norm for _, norm in records] == pytest.approx([norm for _, norm in serial], rel=1e-5)
