"""The README's torchrun path: pretrain_gpt under torch's own launcher ends with exit code 0.

It used to train and then abort at interpreter exit ("terminate called without an active
exception", SIGABRT) in 5 runs of 12: a gloo group's worker thread still held a finished
collective, asked for the GIL to let go of its tensor, and was ended by the interpreter's
shutdown inside a C++ destructor. pretrain_gpt.main now destroys the groups before it returns
(training.destroy_global_state). The abort was a race, so the job runs several times.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from minitron.launcher.ports import free_port

TORCHRUN = str(Path(sys.executable).parent / "torchrun")
RUNS = 5

# The README's section, with --pipeline-model-parallel-size 2 (4 ranks: tp 2 x pp 2) and two
# iterations: training is what left a collective behind; initialization alone never did.
FLAGS = ["--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--train-iters", "2",
         "--mock-data", "--distributed-backend", "gloo", "--num-layers", "2", "--hidden-size", "64",
         "--num-attention-heads", "4", "--seq-length", "64", "--micro-batch-size", "1",
         "--global-batch-size", "2", "--lr", "1e-3"]


# In .ci/run's stress stage (`pytest -m stress`), not in a plain pytest run: each run is five
# fresh interpreters importing torch, ~10 s of CPU, and five of them would take a third of the
# suite's 3 minutes. (test_view.py runs the same entry under torchrun once, initialization only.)
@pytest.mark.stress
def test_a_torchrun_training_job_exits_0_every_time(tmp_path):
    for run in range(RUNS):
        # A port of our own: torchrun's default (29500) may be in use by another job here.
        command = [TORCHRUN, "--nproc-per-node", "4", "--master-port", str(free_port()),
                   "-m", "minitron.pretrain_gpt", *FLAGS]
        proc = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=300)
        out = proc.stdout + proc.stderr
        assert "iteration        2/       2" in out, out[-3000:]   # it did train
        assert "terminate called" not in out, f"run {run}: {out[-3000:]}"
        assert proc.returncode == 0, f"run {run} exited {proc.returncode}: {out[-3000:]}"


@pytest.mark.parametrize("rank,says", [("0", True), ("1", False)])
def test_a_bad_flag_under_torchrun_is_one_line_from_rank_0(rank, says, monkeypatch, capsys):
    """Under torchrun no launching process checks the flags first: each rank's pretrain_gpt
    refuses them itself, rank 0 in one line, every rank with exit code 2, no traceback."""
    from minitron import pretrain_gpt

    monkeypatch.setenv("RANK", rank)
    monkeypatch.setenv("WORLD_SIZE", "4")    # the job's layout, tp 2 x pp 2, as torchrun sets it
    code = pretrain_gpt.main(FLAGS[:FLAGS.index("--lr")])   # every flag of the job but --lr
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    assert err.splitlines() == (["minitron: error: --lr is required for training (e.g. --lr 1e-3)"] if says else [])
