"""Megatron's scripts pass --distributed-backend nccl. The commands that start no real rank
(estimate counts; a fake play moves nothing) answer for such a script on a machine without a
GPU; the commands that start ranks still refuse nccl there, in one line."""

from __future__ import annotations

import pytest

from cli_here import run_minitron
from minitron.training.arguments import gpus_possible

pytestmark = pytest.mark.skipif(gpus_possible(), reason="a GPU may be here: nccl would be allowed anyway")
MODEL = ["--tp", "2", "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "1", "--distributed-backend", "nccl"]


def test_estimate_and_a_fake_trace_answer_for_an_nccl_job(tmp_path):
    done = run_minitron("estimate", "--world", "4", *MODEL, here=True)
    assert done.returncode == 0 and "compute:" in done.stdout, done.stderr
    done = run_minitron("trace", "--backend", "fake", "--world", "4", "--ranks", "0,3", "--out", tmp_path / "t",
                        *MODEL, here=True)
    assert done.returncode == 0 and "fake backend" in done.stdout, done.stderr


def test_a_real_trace_still_refuses_nccl_without_a_gpu(tmp_path):
    done = run_minitron("trace", "--world", "2", "--out", tmp_path / "t", *MODEL, here=True)
    assert done.returncode == 2 and "needs CUDA GPUs" in done.stderr and len(done.stderr.strip().splitlines()) == 1
