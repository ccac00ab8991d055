"""Issue 41: a hang watch costs nothing when all is well. `pretrain --hang-timeout` without a hang
trains to the same figures as without, records the same calls, and asks no rank anything.

Two 2-rank trainings: stress (each ~10 s of CPU on 2 cores), left out of the README's run."""

from __future__ import annotations

import json
import os

import pytest

from cli_here import run_minitron
from minitron.trace.reader import read_trace

pytestmark = pytest.mark.stress
FLAGS = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "3", "--lr", "1e-4",
         "--mock-data", "--hidden-dropout", "0", "--attention-dropout", "0"]


def train(tmp_path, name: str, *extra) -> tuple[list[dict], dict]:
    logs, trace_dir = tmp_path / f"{name}-logs", tmp_path / name
    proc = run_minitron("pretrain", "--world", "2", "--log-dir", logs, "--trace", trace_dir, *extra, *FLAGS,
                        env={**os.environ, "COLUMNS": "200"}, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    lines = [json.loads(line) for line in (logs / "iterations.jsonl").read_text().splitlines()]
    return lines, read_trace(trace_dir)[0]


def test_a_watched_training_that_does_not_hang_changes_no_figure(tmp_path):
    plain, plain_trace = train(tmp_path, "plain")
    watched, watched_trace = train(tmp_path, "watched", "--hang-timeout", "60")
    figures = ("iteration", "lm_loss", "grad_norm", "lr", "consumed_samples")
    assert [[it[k] for k in figures] for it in watched] == [[it[k] for k in figures] for it in plain]
    for rank in plain_trace:
        assert [r["name"] for r in watched_trace[rank]] == [r["name"] for r in plain_trace[rank]]
    assert not list((tmp_path / "watched").glob("*.where.json")), "a rank was asked where it was"
