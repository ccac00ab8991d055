"""Every parallel layout trains like the serial model: per-iteration lm loss within 1e-5.

Each run is `pretrain_gpt` on forked gloo ranks (the launcher's API, so the ranks start warm
from this process), three iterations of a small GPT on mock data with dropout off, the weights
updated between iterations. The vocabulary (1023 + end-of-document = 1024 rows) pads to the
same size for every tensor-parallel size used here.
"""

import pytest

from distributed import pretrain_records

ITERS = 3
MODEL = ["--num-layers", "8", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", str(ITERS), "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo"]


def run(tmp_path, name, world, *flags):
    return [record["lm_loss"] for record in pretrain_records(tmp_path / name, world, [*MODEL, *flags])]


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    return run(tmp_path_factory.mktemp("serial"), "serial", 1)


LAYOUTS = {
    "tp2": (2, ["--tensor-model-parallel-size", "2"]),
    "pp2": (2, ["--pipeline-model-parallel-size", "2"]),
    "dp2": (2, []),
    "tp2-pp2-dp2": (8, ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]),
    "pp4-vp2": (4, ["--pipeline-model-parallel-size", "4", "--virtual-pipeline-model-parallel-size", "2"]),
    "pp2-dp2-distopt": (4, ["--pipeline-model-parallel-size", "2", "--use-distributed-optimizer"]),
}


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_serial(tmp_path, serial, name):
    world, flags = LAYOUTS[name]
    losses = run(tmp_path, name, world, *flags)
    assert len(losses) == ITERS
    assert losses == pytest.approx(serial, rel=1e-5), f"{name}: {losses} vs serial {serial}"
    assert losses[-1] != losses[0]  # the weights really changed between iterations
