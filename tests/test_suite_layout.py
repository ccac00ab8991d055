"""The suite's own layout: under the workers of pyproject's addopts, a file's module
fixtures run once.

Why this is tested: the suite once dealt its tests by xdist groups, and a change in pytest
(9.2 reads a test's id from ``_id``, where xdist 3.8 writes ``_nodeid``) made every group fall
apart into single tests without a word: each worker that got a test of a file ran that file's
module fixtures again, and the suite did its most expensive runs twice (conftest.py). Here a
small project of three files, each with a module fixture that notes where it ran, is run with
the repository's own addopts: every fixture must have run once, and each file's tests in one
worker.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; the README's floor is 3.10

ROOT = Path(__file__).resolve().parent.parent

PROBE = '''
import os
import pytest

@pytest.fixture(scope="module")
def setup_once(request):
    with open(os.environ["NOTES"], "a") as notes:
        notes.write(f"fixture {request.module.__name__} {os.environ.get('PYTEST_XDIST_WORKER')}\\n")

@pytest.mark.parametrize("n", range(6))
def test_probe(setup_once, n):
    with open(os.environ["NOTES"], "a") as notes:
        notes.write(f"test {__name__} {os.environ.get('PYTEST_XDIST_WORKER')}\\n")
'''


def test_each_file_runs_in_one_worker_and_its_module_fixture_once(tmp_path):
    addopts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["addopts"]
    assert "-n" in addopts.split(), "the suite no longer runs in workers: drop this test with the workers"
    for name in ("test_a", "test_b", "test_c"):
        (tmp_path / f"{name}.py").write_text(PROBE)
    (tmp_path / "pytest.ini").write_text(f"[pytest]\naddopts = {addopts}\nmarkers = stress: -\n")
    notes = tmp_path / "notes.txt"
    # Hypothesis's plugin left out: it deals nothing (xdist does), and loading it in the run and
    # in each of its workers was ~40% of this test's CPU.
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "no:hypothesispytest",
                           str(tmp_path)],
                          cwd=tmp_path, env={"NOTES": str(notes), "PATH": "/usr/bin:/bin"},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    lines = [line.split() for line in notes.read_text().splitlines()]
    fixtures = [(module, worker) for kind, module, worker in lines if kind == "fixture"]
    assert sorted(module for module, _ in fixtures) == ["test_a", "test_b", "test_c"], fixtures
    workers = {}
    for kind, module, worker in lines:
        workers.setdefault(module, set()).add(worker)
    assert all(len(found) == 1 and found != {"None"} for found in workers.values()), workers
