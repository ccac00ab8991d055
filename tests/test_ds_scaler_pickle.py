"""The loss scaler in minitron's ZeRO checkpoints is pickled as DeepSpeed's own object.

DeepSpeed's engine adopts the unpickled scaler and calls its methods, so the file must name
``deepspeed.runtime.fp16.loss_scaler.LossScaler`` / ``DynamicLossScaler`` and hold exactly a real
one's attributes; minitron writes that without DeepSpeed (pickles.py) and reads it back, as it
reads the dict it wrote before. A stage DeepSpeed wrote (an enum), read back and written on by
ds_to_universal, goes out as an enum again. The last test, marked ``deepspeed``, unpickles the file with the
real 0.19.8 and compares it with a scaler DeepSpeed made itself (in a fresh interpreter: the
tests' process stays free of DeepSpeed, test_ds_peer.py says why).
"""

import io
import os
import pickletools
import subprocess
import sys
import zipfile

import pytest
import torch

from minitron.runtime.checkpoint.pickles import DeepSpeedObject, _Unpickler, load_state, save_state
from minitron.runtime.checkpoint.zero_checkpoint import deepspeed_scaler, scaler_state
from minitron.runtime.loss_scaler import CreateLossScaler
from deepspeed_child import needs_deepspeed

DYNAMIC_ARGS = {"init_scale": 2.0 ** 16, "scale_window": 2, "min_scale": 1.0, "delayed_shift": 2,
                "consecutive_hysteresis": False}
# vars() of DeepSpeed 0.19.8's scalers, in the order their __init__ sets them.
DEEPSPEED_ATTRIBUTES = {
    "LossScaler": ["cur_scale", "dynamic"],
    "DynamicLossScaler": ["cur_scale", "dynamic", "cur_iter", "last_overflow_iter", "scale_factor", "scale_window",
                          "min_scale", "delayed_shift", "cur_hysteresis", "consecutive_hysteresis",
                          "raise_error_at_min_scale", "dtype"]}


def _scalers(moved: bool = True) -> dict:
    """Class name -> a minitron scaler; one that has moved (so a default value cannot pass for a
    read one), or a fresh one with other values."""
    dynamic = CreateLossScaler(torch.half, 0, True, DYNAMIC_ARGS)
    for _ in range(3 if moved else 0):   # clean steps (an overflow would log through DeepSpeed's
        dynamic.update_scale(False)      # process group, absent in its test below): one growth
    return {"LossScaler": CreateLossScaler(torch.half, 128.0 if moved else 1.0, False, None),
            "DynamicLossScaler": dynamic}


# What Python's pickle writes for DeepSpeed's ZeroStageEnum.gradients (protocol 2): call the
# class on 2. The stage in a DeepSpeed-written file, which ds_to_universal copies on.
STAGE_ENUM = b"\x80\x02cdeepspeed.runtime.zero.config\nZeroStageEnum\nK\x02\x85R."


def _ops(path) -> list:
    """A torch.save file's pickle opcodes, as (name, argument)."""
    with zipfile.ZipFile(path) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("data.pkl")))
    return [(op.name, arg) for op, arg, _ in pickletools.genops(data)]


def _globals(path) -> list:
    """The classes a torch.save file's pickle names (GLOBAL opcodes), as 'module name'."""
    return [arg for name, arg in _ops(path) if name == "GLOBAL"]


@pytest.mark.parametrize("name", sorted(DEEPSPEED_ATTRIBUTES))
def test_scaler_pickles_as_deepspeeds_class_and_reads_back(name, tmp_path):
    scaler = _scalers()[name]
    save_state({"loss_scaler": deepspeed_scaler(scaler)}, tmp_path / "s.pt")
    assert f"deepspeed.runtime.fp16.loss_scaler {name}" in _globals(tmp_path / "s.pt")
    back = load_state(tmp_path / "s.pt")["loss_scaler"]
    assert isinstance(back, DeepSpeedObject) and type(back).__qualname__ == name
    assert list(vars(back)) == DEEPSPEED_ATTRIBUTES[name]
    fresh = _scalers(moved=False)[name]
    fresh.load_state_dict(scaler_state(fresh, back))
    assert fresh.state_dict() == scaler.state_dict() != _scalers(moved=False)[name].state_dict()
    # Written again (ds_to_universal copies it on), a read-back stand-in gives the same bytes.
    save_state({"loss_scaler": back}, tmp_path / "again.pt")
    assert load_state(tmp_path / "again.pt")["loss_scaler"] == back


def test_the_dict_minitron_wrote_before_still_loads():
    scaler = _scalers()["DynamicLossScaler"]
    fresh = _scalers(moved=False)["DynamicLossScaler"]
    fresh.load_state_dict(scaler_state(fresh, scaler.state_dict()))
    assert fresh.state_dict() == scaler.state_dict() != _scalers(moved=False)["DynamicLossScaler"].state_dict()


def test_a_stage_read_back_is_written_as_an_enum(tmp_path):
    stage = _Unpickler(io.BytesIO(STAGE_ENUM)).load()
    assert int(stage) == 2
    save_state({"zero_stage": stage}, tmp_path / "enum.pt")
    ops = [name for name, _ in _ops(tmp_path / "enum.pt")]
    assert "REDUCE" in ops and "NEWOBJ" not in ops and "BUILD" not in ops
    assert load_state(tmp_path / "enum.pt")["zero_stage"] == stage


_REAL = """
import sys, torch
from deepspeed.runtime.fp16.loss_scaler import CreateLossScaler
args = dict(init_scale=2.0 ** 16, scale_window=2, min_scale=1.0, delayed_shift=2, consecutive_hysteresis=False,
            raise_error_at_min_scale=True)
real = {"LossScaler": CreateLossScaler(torch.half, 128.0, False, None),
        "DynamicLossScaler": CreateLossScaler(torch.half, 0, True, args)}
for _ in range(3):
    real["DynamicLossScaler"].update_scale(False)
for name, scaler in real.items():
    ours = torch.load(sys.argv[1] + "/" + name + ".pt", weights_only=False)["loss_scaler"]
    assert type(ours) is type(scaler), (name, type(ours))
    assert list(vars(ours).items()) == list(vars(scaler).items()), (name, vars(ours), vars(scaler))
    assert float(ours.scale_loss(torch.tensor(3.0))) == 3.0 * scaler.cur_scale
from deepspeed.runtime.zero.config import ZeroStageEnum
assert torch.load(sys.argv[1] + "/enum.pt", weights_only=False)["zero_stage"] is ZeroStageEnum.gradients
"""


@needs_deepspeed
def test_deepspeed_unpickles_its_own_scaler(tmp_path):
    for name, scaler in _scalers().items():
        save_state({"loss_scaler": deepspeed_scaler(scaler)}, tmp_path / f"{name}.pt")
    save_state({"zero_stage": _Unpickler(io.BytesIO(STAGE_ENUM)).load()}, tmp_path / "enum.pt")
    done = subprocess.run([sys.executable, "-c", _REAL, str(tmp_path)], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert done.returncode == 0, done.stderr[-3000:]
