"""minitron's universal checkpoint held against the real DeepSpeed 0.19.8 (the ``peer`` extra):

* DeepSpeed's own ``ds_to_universal`` converts minitron's ZeRO 1 and ZeRO 3 checkpoints (two
  ranks, test_ds_universal.py's run) into the very files minitron's converter writes: the same
  file list, and every file the same keys and the same tensors, bit for bit;
* DeepSpeed's engine loads minitron's universal checkpoint as written and resumes the run: the
  next two losses are the uninterrupted run's (the loss scaler, which DeepSpeed's engine adopts
  and calls, is pickled as DeepSpeed's own LossScaler: pickles.py);
* where DeepSpeed itself cannot load a universal checkpoint, asserted as it fails: it looks for
  the model-states file under the *loading* stage's name, so a checkpoint converted from stage 3
  loads only at stage 3 and one from stages 1-2 only at 1-2; and at stage 0 in fp32 it has no
  ZeRO optimizer to read ``zero/`` with. minitron's engine loads all of them
  (test_ds_universal.py).

The parent process never imports DeepSpeed: the converter runs as a fresh interpreter, the
engines in forked ranks (test_ds_peer.py says why).
"""

import os
import subprocess
import sys

import pytest
import torch

from distributed import run_ranks
from minitron.runtime.checkpoint.pickles import load_state
from test_ds_checkpoint import TiedNet
from test_ds_universal import SOURCES, config, runs, train  # noqa: F401 -- runs: the fixture, shared
from deepspeed_child import NEEDS_DEEPSPEED

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it


def _same(ours, theirs, where: str) -> None:
    """Equal all the way down: keys in the same order, tensors bit for bit with dtype and shape."""
    if torch.is_tensor(theirs):
        assert torch.is_tensor(ours) and ours.dtype == theirs.dtype and torch.equal(ours, theirs), where
    elif isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs), where
        for key in theirs:
            _same(ours[key], theirs[key], f"{where}.{key}")
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), where
        for i, (a, b) in enumerate(zip(ours, theirs)):
            _same(a, b, f"{where}[{i}]")
    else:
        assert ours == theirs, where


@pytest.mark.parametrize("stage", SOURCES)
def test_deepspeeds_converter_writes_minitrons_files(runs, stage, tmp_path):
    root = runs[0]
    out = tmp_path / "global_step2"
    done = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal",
                           "--input_folder", str(root / str(stage) / "global_step2"), "--output_folder", str(out),
                           "--num_extract_workers", "1", "--num_merge_workers", "1"],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    mine = root / f"uni{stage}"
    files = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    assert files == sorted(str(p.relative_to(mine)) for p in mine.rglob("*") if p.is_file())
    assert len([f for f in files if f.endswith("fp32.pt")]) >= 9
    for name in files:
        if name.endswith(".pt"):
            _same(load_state(mine / name), load_state(tmp_path / name), name)
        else:
            assert (mine / name).read_text() == (tmp_path / name).read_text(), name


def _deepspeed_loads(root: str):
    """DeepSpeed's engine at each (source, stage), loading minitron's universal checkpoint."""
    def body(rank):
        import deepspeed   # only in the ranks: the tests' parent process stays free of it
        out = {}
        for source in SOURCES:
            for stage in (0, 1, 2, 3):
                try:
                    engine, *_ = deepspeed.initialize(model=TiedNet(seed=9), config=config(stage))
                    engine.load_checkpoint(f"{root}/uni{source}")
                    out[source, stage] = train(engine, (2, 3))
                except (AttributeError, AssertionError) as failure:
                    out[source, stage] = f"{type(failure).__name__}: {failure}"
        return out
    return body


@pytest.fixture(scope="module")
def deepspeed_loads(runs):  # noqa: F811 -- the imported fixture, asked for by name
    root, full, _ = runs
    return full, run_ranks(_deepspeed_loads(str(root)), world_size=2, tp=None)


def test_deepspeeds_engine_loads_minitrons_universal_checkpoint(deepspeed_loads):
    full, ranks = deepspeed_loads
    for out in ranks:
        for source in SOURCES:
            same_family = (1, 2) if source < 3 else (3,)
            for stage in same_family:
                assert out[source, stage] == pytest.approx(full[source], rel=1e-6), (source, stage)
            for stage in {0, 1, 2, 3} - set(same_family) - {0}:   # no model-states file under its name
                assert out[source, stage] == "AssertionError: ", (source, stage)
        # Stage 0 in fp32: from stages 1-2 the model-states file's optimizer is None, and
        # DeepSpeed hands it to torch's load_state_dict; from stage 3 no file has its name.
        assert out[1, 0] == "AttributeError: 'NoneType' object has no attribute 'copy'"
        assert out[3, 0] == "AssertionError: "
