"""test_ds_monitor.py's run held against the real DeepSpeed 0.19.8 on its CPU accelerator, in the
same forked gloo ranks: with csv_monitor and wall_clock_breakdown on, both engines write the same
CSV files (names, headers, steps; the lr values equal, the timings only non-negative) from rank 0
only, and print the same sequence of timer lines, timer names in the same order.

fp16 is not run here: DeepSpeed's CPU accelerator refuses it, so the loss-scale file is checked
in test_ds_monitor.py alone.
"""
import contextlib
import io
import os
import re

import pytest

from distributed import run_ranks
from deepspeed_child import NEEDS_DEEPSPEED
from test_ds_checkpoint import TiedNet, train
from test_ds_monitor import monitored, read_csvs

pytestmark = NEEDS_DEEPSPEED
os.environ.setdefault("DS_ACCELERATOR", "cpu")   # the forked ranks inherit it


def _both(root: str, precision: str):
    def body(rank):
        import deepspeed   # only in the ranks: the tests' parent process stays free of it
        from minitron.runtime import initialize
        out = {}
        for who, init in (("minitron", initialize), ("deepspeed", deepspeed.initialize)):
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                engine, *_ = init(model=TiedNet(), config=monitored(f"{root}/{who}/rank{rank}", precision))
                train(engine, rank, precision, range(4))
            out[who] = printed.getvalue()
        return out
    return body


def timer_lines(text: str) -> list:
    """Each '[Rank 0] time (ms) | name: value | ...' line, its names only."""
    return [re.findall(r"\| (\w+): \d+\.\d\d", line) for line in text.splitlines() if "time (ms)" in line]


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_same_files_and_lines_as_deepspeed(tmp_path, precision):
    printed = run_ranks(_both(str(tmp_path), precision), world_size=2, tp=None)
    mine, ds = (read_csvs(tmp_path / who / "rank0" / "job") for who in ("minitron", "deepspeed"))
    assert sorted(mine) == sorted(ds)
    for name in ds:
        assert [row[0] for row in mine[name]] == [row[0] for row in ds[name]]   # header and steps
        assert mine[name][0] == ds[name][0]
    assert mine["Train_Samples_lr.csv"] == ds["Train_Samples_lr.csv"]
    assert not (tmp_path / "minitron" / "rank1").exists() and not (tmp_path / "deepspeed" / "rank1").exists()
    assert timer_lines(printed[0]["minitron"]) == timer_lines(printed[0]["deepspeed"])
    assert len(timer_lines(printed[0]["deepspeed"])) == 6 and timer_lines(printed[1]["minitron"]) == []
