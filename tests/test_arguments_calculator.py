"""The micro-batch calculator speaks Megatron Core's API; Megatron's own unit tests say so.

Set MEGATRON_LM_DIR to a Megatron-LM checkout (a work tree or a bare clone) to run
Megatron's tests/unit_tests/test_num_microbatches_calculator.py against minitron's module,
imported under Megatron's name. Releases from core_v0.18 on replaced ramp-up with step
schedules; for such a checkout the test file is taken from MEGATRON_LM_REF (default
core_v0.17.1, the last release with ramp-up) through git.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import minitron.core.num_microbatches_calculator as calc

ROOT = Path(__file__).resolve().parents[1]
MEGATRON_TEST = "tests/unit_tests/test_num_microbatches_calculator.py"
ALIAS = '''import sys, types
import minitron.core.num_microbatches_calculator as ours
megatron, core = types.ModuleType("megatron"), types.ModuleType("megatron.core")
megatron.core, core.num_microbatches_calculator = core, ours
sys.modules.update({"megatron": megatron, "megatron.core": core,
                    "megatron.core.num_microbatches_calculator": ours})
'''


def _megatron_test_source(checkout: Path) -> str | None:
    work_tree = checkout / MEGATRON_TEST
    if work_tree.is_file() and "Rampup" in work_tree.read_text():
        return work_tree.read_text()
    ref = os.environ.get("MEGATRON_LM_REF", "core_v0.17.1")
    shown = subprocess.run(["git", "-C", str(checkout), "show", f"{ref}:{MEGATRON_TEST}"],
                           capture_output=True, text=True)
    return shown.stdout if shown.returncode == 0 else None


def test_megatron_unit_tests_pass_against_ours(tmp_path):
    checkout = os.environ.get("MEGATRON_LM_DIR")
    if not checkout:
        pytest.skip("set MEGATRON_LM_DIR to a Megatron-LM checkout to run its calculator tests here")
    source = _megatron_test_source(Path(checkout))
    if source is None:
        pytest.skip(f"{checkout} has no ramp-up version of {MEGATRON_TEST} (set MEGATRON_LM_REF)")
    (tmp_path / "conftest.py").write_text(ALIAS)
    (tmp_path / "test_megatron_calculator.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(tmp_path)],
                         cwd=tmp_path, env=env, capture_output=True, text=True)
    summary = run.stdout.strip().splitlines()[-1] if run.stdout.strip() else run.stderr
    assert run.returncode == 0 and "passed" in summary and "failed" not in summary, run.stdout[-3000:]


def test_second_init_is_refused_and_reconfigure_replaces():
    calc.destroy_num_microbatches_calculator()
    calc.init_num_microbatches_calculator(0, None, 32, 8, 2)
    with pytest.raises(AssertionError, match="already initialized"):
        calc.init_num_microbatches_calculator(0, None, 32, 8, 2)
    calc.reconfigure_num_microbatches_calculator(0, None, 16, 8, 2)
    assert calc.get_num_microbatches() == 1 and calc.get_current_global_batch_size() == 16
    calc.destroy_num_microbatches_calculator()


def test_decrease_batch_size_if_needed_runs_the_largest_fitting_batch():
    built = calc._build_num_microbatches_calculator(0, None, 33, 8, 2, True)
    assert (built.get(), built.get_current_global_batch_size(), built.get_current_running_global_batch_size()) \
        == (2, 33, 32)
    with pytest.raises(AssertionError, match="not divisible"):
        calc._build_num_microbatches_calculator(0, None, 33, 8, 2, False)


def test_rampup_skips_sizes_between_updates():
    # 8 -> 16 over 8 samples on micro 1 x dp 8: the 12 in between is never run (Megatron trains it).
    ramp = calc._build_num_microbatches_calculator(0, [8, 4, 8], 16, 1, 8)
    seen, consumed = [], 0
    for _ in range(3):
        ramp.update(consumed, consistency_check=True)
        seen.append(ramp.get_current_global_batch_size())
        consumed += seen[-1]
    assert seen == [8, 16, 16]
