"""Run one function of a test module in a child process, for the peer tests that call DeepSpeed's
own code: the tests' parent process never imports DeepSpeed (test_ds_peer.py says why), and the
answer comes back as JSON, whose floats round-trip bit for bit."""

from __future__ import annotations

import json
import os
import subprocess
import sys


def answer_in_child(module: str, function: str, argument: str):
    """``module.function(argument)`` (a module of tests/) in a fresh interpreter, on DeepSpeed's CPU accelerator."""
    here = os.path.dirname(os.path.abspath(__file__))
    code = (f"import sys, json; sys.path.insert(0, {here!r}); from {module} import {function}; "
            f"print(json.dumps({function}({argument!r})))")
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                           env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert child.returncode == 0, child.stderr[-2000:]
    return json.loads(child.stdout.strip().splitlines()[-1])   # (DeepSpeed may print before it)
