"""Run one function of a test module in a child process, for the peer tests that call DeepSpeed's
own code: the tests' parent process never imports DeepSpeed (test_ds_peer.py says why), and the
answer comes back as JSON, whose floats round-trip bit for bit."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

# The two marks every test held against the real DeepSpeed carries: `pytest -m deepspeed` (the
# peer stage of .ci/run) selects it, and it is skipped, saying how to get DeepSpeed, where it is
# not installed. A module sets ``pytestmark = NEEDS_DEEPSPEED``; a single test takes
# ``@needs_deepspeed``.
NO_DEEPSPEED = "needs the real DeepSpeed 0.19.8: the peer extra (pyproject.toml says how to install it)"
NEEDS_DEEPSPEED = [pytest.mark.deepspeed,
                   pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason=NO_DEEPSPEED)]


def needs_deepspeed(test):
    for mark in NEEDS_DEEPSPEED:
        test = mark(test)
    return test


def answer_in_child(module: str, function: str, argument: str):
    """``module.function(argument)`` (a module of tests/) in a fresh interpreter, on DeepSpeed's CPU accelerator."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys, json; sys.path.insert(0, {here!r}); from {module} import {function}; "
            f"print(json.dumps({function}({argument!r})))")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert child.returncode == 0, child.stderr[-2000:]
    return json.loads(child.stdout.strip().splitlines()[-1])   # (DeepSpeed may print before it)
