"""Save with --ckpt-format torch_dist at one layout, resume at another: the resumed losses are
the serial run's at the same iterations (rel 1e-5, as test_training_equivalence.py).

Default suite (world <= 4): saved at tp 2 x pp 2 with the distributed optimizer (world 4),
resumed at tp 1 x pp 1 x dp 4 with the distributed optimizer and at tp 1 with the plain one.
The world-8 matrix is a stress test (.ci/run's stress stage).
"""

from __future__ import annotations

import json

import pytest

from distributed import pretrain_records
from minitron.training.checkpoint_files import TRACKER, iteration_dir

MODEL = ["--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "4", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--swiglu"]


def layout(tp: int, pp: int, *extra) -> list[str]:
    return ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp), *extra]


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("resume")
    serial = pretrain_records(tmp / "serial", 1, MODEL)
    first = pretrain_records(tmp / "first", 4, MODEL + layout(2, 2, "--use-distributed-optimizer") + [
        "--exit-interval", "2", "--save", str(tmp / "ck"), "--ckpt-format", "torch_dist"])
    return tmp, serial, first


def _losses(records):
    return [r["lm_loss"] for r in records]


def test_the_first_half_is_the_serial_run(saved):
    _, serial, first = saved
    assert _losses(first) == pytest.approx(_losses(serial)[:2], rel=1e-5)
    ck = saved[0] / "ck"
    assert (ck / TRACKER).read_text() == "2"
    meta = json.loads((iteration_dir(ck, 2) / "metadata.json").read_text())
    assert meta["sharded_backend"] == "torch_dist"


@pytest.mark.parametrize("world, flags", [(4, layout(1, 1, "--use-distributed-optimizer")), (1, layout(1, 1))],
                         ids=["tp1-dp4-distopt", "serial"])
def test_resumed_at_another_layout_continues_the_serial_run(saved, world, flags):
    tmp, serial, _ = saved
    name = "-".join(flags)
    second = pretrain_records(tmp / name, world, MODEL + flags + ["--load", str(tmp / "ck")])
    assert [r["iteration"] for r in second] == [3, 4]
    assert _losses(second) == pytest.approx(_losses(serial)[2:], rel=1e-5)
