"""minitron's checkpoints held against the real DeepSpeed 0.19.8 (the ``peer`` extra), both ways,
with either Adam a ds_config may ask for: DeepSpeed's default, FusedAdam, and, with
``torch_adam: true``, torch's AdamW, which keep their state in different forms (FusedAdam's
param groups carry ``bias_correction`` and its step counts are ints; torch's are tensors; at
stage 0 in 16 bits DeepSpeed wraps each in another optimizer, FP16_Optimizer or
FP16_UnfusedOptimizer). minitron runs the Adam the config names (ops/adam/fused_adam.py):

* the same run saved by both, with the same config, has the same file list and the same keys,
  ZeRO 0-3, fp32 and bf16, down to the Adam's param-group keys and the type of its step counts
  (DeepSpeed's CPU accelerator refuses fp16 on a CPU without fp16 support, so fp16 is checked
  against the literal lists in test_ds_checkpoint.py only);
* DeepSpeed's own ``zero_to_fp32`` rebuilds from minitron's checkpoints the weights minitron's
  engine holds, at stages 1-3 (it reads no stage-0 checkpoint, DeepSpeed's own included);
* a checkpoint DeepSpeed wrote, with either Adam, loads into minitron's engine running its
  default Adam, whose next two steps then give the losses DeepSpeed's next two steps give;
* and the other way: a checkpoint minitron wrote loads into DeepSpeed's engine given the same
  config, at every stage, whose next two steps give the losses minitron's own resume gives (the
  loss scaler, which DeepSpeed adopts as its own and calls, is pickled as DeepSpeed's
  LossScaler: pickles.py).

DeepSpeed runs in the same forked gloo ranks as minitron, on its CPU accelerator. Its first run
JIT-builds two small ops, a shared-memory collective and the CPU FusedAdam (about two minutes
each on two cores, cached after). The parent process never imports DeepSpeed: it reads the
files through minitron's stand-ins for DeepSpeed's pickled objects.
"""
import os
import subprocess
import sys

import pytest
import torch

from distributed import run_ranks
from minitron.runtime.checkpoint.pickles import load_state
from minitron.runtime.checkpoint.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint as rebuild
from test_ds_checkpoint import NEXT, WORLD, TiedNet, ds_config, files_under, resume, train
from deepspeed_child import NEEDS_DEEPSPEED

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it

PRECISIONS, ADAMS = ("fp32", "bf16"), ("fused", "torch")


def _deepspeed_engine(stage: int, precision: str, adam: str):
    import deepspeed   # only in the ranks: the tests' parent process stays free of it
    engine, *_ = deepspeed.initialize(model=TiedNet(), config=ds_config(stage, precision, adam == "torch"))
    return engine


def _deepspeed_resumes(where: str, stage: int, precision: str, adam: str, rank: int):
    """DeepSpeed's engine loads ``where`` and runs the next two steps (or the error it fails with)."""
    try:
        ds = _deepspeed_engine(stage, precision, adam)
        ds.load_checkpoint(where)
        return {"again": train(ds, rank, precision, NEXT), "steps": ds.global_steps}
    except (KeyError, AttributeError, RuntimeError) as failure:   # reported as a value, not raised in a rank
        return f"{type(failure).__name__}: {failure}"


def _both_save(root: str):
    """Each stage, precision and Adam: minitron trains two steps and saves, and both a fresh
    minitron engine and a fresh DeepSpeed engine, given the same config, load that and run two
    more; DeepSpeed trains the same two, saves and runs two more, and a fresh minitron engine
    (its default Adam, whichever wrote the file) loads DeepSpeed's checkpoint and runs them too."""
    def body(rank):
        from minitron.runtime import initialize   # in the rank: the engine needs its process group
        out = {}
        for stage in (0, 1, 2, 3):
            for precision in PRECISIONS:
                for adam in ADAMS:
                    torch_adam, where = adam == "torch", f"{root}/minitron_{adam}/{stage}_{precision}"
                    mine, *_ = initialize(model=TiedNet(), config=ds_config(stage, precision, torch_adam))
                    train(mine, rank, precision, range(2))
                    mine.save_checkpoint(where)
                    out["minitron", stage, precision, adam] = {
                        **resume(where, stage, precision, rank, torch_adam),
                        "deepspeed": _deepspeed_resumes(where, stage, precision, adam, rank)}
                for adam in ADAMS:
                    where = f"{root}/ds_{adam}/{stage}_{precision}"
                    ds = _deepspeed_engine(stage, precision, adam)
                    train(ds, rank, precision, range(2))
                    ds.save_checkpoint(where)
                    out[stage, precision, adam] = {"ds_next": train(ds, rank, precision, NEXT),
                                                   **resume(where, stage, precision, rank)}
        return out
    return body


@pytest.fixture(scope="module")
def both(tmp_path_factory):
    root = tmp_path_factory.mktemp("peer")
    return root, run_ranks(_both_save(str(root)), world_size=WORLD, tp=None)


def _keys(value) -> object:
    """The key structure of a checkpoint file, two levels down (values left out)."""
    if isinstance(value, dict):
        return {k: sorted(map(str, v)) if isinstance(v, dict) else None for k, v in value.items()}
    return None


def _adam_form(optimizer: dict) -> tuple:
    """What tells one Adam's state dict from the other's: the param groups' keys, and each
    parameter's state keys with the type its step count has (an int, or torch's tensor)."""
    inner = optimizer.get("optimizer_state_dict", optimizer.get("base_optimizer_state", optimizer))
    return ([sorted(group) for group in inner["param_groups"]],
            sorted({(tuple(sorted(s)), type(s.get("step")).__name__) for s in inner["state"].values()}))


@pytest.mark.parametrize("adam", ADAMS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("stage", (0, 1, 2, 3))
def test_file_list_and_keys_equal_deepspeeds(both, stage, precision, adam):
    root, _ = both
    ds, mine = (root / f"{who}_{adam}" / f"{stage}_{precision}" for who in ("ds", "minitron"))
    assert files_under(mine) == files_under(ds)
    for name in files_under(ds):
        if not name.endswith(".pt"):
            continue
        theirs, ours = (load_state(d / name) for d in (ds, mine))
        assert list(ours) == list(theirs), name
        for key in ("optimizer_state_dict", "optimizer"):   # the optimizer's own keys, at every stage
            if isinstance(ours.get(key), dict):
                assert list(ours[key]) == list(theirs[key]), (name, key)
                assert _adam_form(ours[key]) == _adam_form(theirs[key]), (name, key)
        for key in ("module", "param_shapes", "shared_params", "buffer_names", "frozen_param_shapes"):
            if key in ours:
                assert _keys({key: ours[key]}) == _keys({key: theirs[key]}), (name, key)


_ZERO_TO_FP32 = """
import sys, torch
from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
torch.save(get_fp32_state_dict_from_zero_checkpoint(sys.argv[1]), sys.argv[2])
"""


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("stage", (1, 2, 3))
def test_deepspeeds_zero_to_fp32_reads_minitrons_checkpoint(both, stage, precision, tmp_path):
    root, _ = both
    where = root / "minitron_fused" / f"{stage}_{precision}"
    done = subprocess.run([sys.executable, "-c", _ZERO_TO_FP32, str(where), str(tmp_path / "ds.pt")],
                          capture_output=True, text=True, timeout=300, env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
    theirs = torch.load(tmp_path / "ds.pt")
    ours = rebuild(str(where))   # minitron's own script, the one copied beside the checkpoint
    assert sorted(theirs) == sorted(ours)
    for name, tensor in ours.items():
        assert torch.equal(theirs[name], tensor), name
    if precision == "fp32" and stage < 3:   # the masters are the module's weights, exactly
        module = torch.load(where / "global_step2" / "mp_rank_00_model_states.pt", weights_only=False)["module"]
        for name, tensor in module.items():
            assert torch.equal(theirs[name], tensor), name


@pytest.mark.parametrize("adam", ADAMS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("stage", (0, 1, 2, 3))
def test_deepspeed_checkpoint_resumes_in_minitron(both, stage, precision, adam):
    root, results = both
    for out in results:
        got = out[stage, precision, adam]
        assert got["path"] == str(root / f"ds_{adam}" / f"{stage}_{precision}" / "global_step2") and got["steps"] == 4
        # Two engines from the same state: the same losses up to rounding (the first loss shows
        # the weights came over, the second Adam's moments and the schedule too).
        assert got["again"] == pytest.approx(got["ds_next"], rel=1e-6)


@pytest.mark.parametrize("adam", ADAMS)
@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("stage", (0, 1, 2, 3))
def test_minitron_checkpoint_resumes_in_deepspeed(both, stage, precision, adam):
    _, results = both
    for out in results:
        mine = out["minitron", stage, precision, adam]
        # The same config on both sides: with its default Adam, DeepSpeed steps FusedAdam's state
        # as minitron wrote it (ops/adam/fused_adam.py); with torch_adam, torch's. The scaler it
        # adopts, the masters, the moments and the schedule are minitron's.
        assert mine["deepspeed"] == {"again": pytest.approx(mine["again"], rel=1e-6), "steps": 4}
        assert mine["steps"] == 4
