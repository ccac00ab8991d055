"""torch_names reads the installed torch's own export lists without importing torch, and they
are the lists torch itself has once imported (so a refusal of a misspelt optimizer or schedule
name can stay torch-free and still be exact)."""

import subprocess
import sys

import torch

from minitron.runtime.torch_names import exported, may_be_exported, spelled_as


def test_the_lists_read_from_source_are_torchs_own():
    assert exported("torch.optim") == frozenset(torch.optim.__all__)
    assert exported("torch.optim.lr_scheduler") == frozenset(torch.optim.lr_scheduler.__all__)


def test_a_misspelling_is_found_and_its_spelling_named():
    assert not may_be_exported("torch.optim", "sgd") and may_be_exported("torch.optim", "SGD")
    assert spelled_as("torch.optim", "sgd") == "SGD"
    assert spelled_as("torch.optim.lr_scheduler", "steplr") == "StepLR"
    assert spelled_as("torch.optim", "Nonesuch") is None
    assert may_be_exported("no_such_package.x", "Anything")   # unreadable: the caller imports to find out


def test_reading_them_imports_no_torch():
    code = ("import sys; from minitron.runtime.torch_names import exported; "
            "assert exported('torch.optim'); print('torch' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "False"
