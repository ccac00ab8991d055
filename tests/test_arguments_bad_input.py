"""Bad input, one table: `minitron` answers each row with exit 2 and one line on stderr, no
traceback, and starts no rank (its log directory never appears). The first row runs the real
executable, the others its entry point in this process (tests/cli_here.py). Rows from issues
#9, #11 and #12."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from cli_here import MINITRON, minitron_here

ROOT = Path(__file__).resolve().parents[1]
MODEL = "--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 8 --micro-batch-size 1"
TRAIN = f"{MODEL} --train-iters 2 --lr 1e-3 --mock-data"

# (pretrain's --world, the flags after it, words the one line must contain)
CASES = [
    (8, f"--tensor-model-parallel-size 3 {TRAIN}", "not divisible by tensor x pipeline"),
    (2, f"--global-batch-size 7 {TRAIN}", "not a multiple of micro batch"),
    (2, f"{TRAIN} --exit-interval -1", "--exit-interval: must be at least 1"),
    (2, f"{TRAIN} --lr -1", "--lr: must be >= 0"),
    (2, f"{TRAIN} --lr nan", "--lr: must be a finite number"),
    (2, f"{MODEL} --train-iters 2 --mock-data", "--lr is required"),
    (2, f"{TRAIN} --min-lr 0.1", "--min-lr 0.1 is above --lr"),
    (2, f"{MODEL} --train-iters 2 --lr 1e-3", "training needs data"),
    (2, f"{TRAIN} --micro-batch-size 0", "--micro-batch-size: must be at least 1"),
    (2, f"{TRAIN} --train-iters -3", "--train-iters: must be at least 0"),
    (2, f"{TRAIN} --hidden-dropout 1", "--hidden-dropout: must be >= 0 and < 1"),
    (2, f"{TRAIN} --adam-eps 0", "--adam-eps: must be > 0"),
    (2, f"{TRAIN} --seed -1", "--seed: must be at least 0"),
    (2, f"{TRAIN} --micro-batch-size two", "expected a whole number, got 'two'"),
    (2, f"{TRAIN} --expert-model-parallel-size 2", "add --num-experts"),
    (8, f"{MODEL} --global-batch-size 16 --rampup-batch-size 8 4 8 --train-iters 4 --lr 1e-3 --mock-data",
     "expected no batch-size rampup for iteration-based training"),
    (8, f"{MODEL} --global-batch-size 16 --rampup-batch-size 8 4 100 --train-samples 640 --lr 1e-3 "
        f"--mock-data", "the ramp-up reaches a global batch of 12"),
    (2, f"{TRAIN} --train-samples 8", "--train-iters or --train-samples, not both"),
    (4, f"{TRAIN} --pipeline-model-parallel-size 2 --num-layers 4 --num-virtual-stages-per-pipeline-rank 2 "
        f"--num-layers-per-virtual-pipeline-stage 1", "not both"),
    # activation recomputation and the modern GPT options
    (2, f"{TRAIN} --recompute-granularity full", "needs --recompute-method uniform or block"),
    (2, f"{TRAIN} --recompute-granularity full --recompute-method block --recompute-num-layers 3",
     "between 1 and the 2 layers"),
    (2, f"{TRAIN} --recompute-activations --recompute-method uniform", "drop --recompute-method"),
    (2, f"{TRAIN} --num-attention-heads 12 --hidden-size 24 --tensor-model-parallel-size 2 --group-query-attention "
        "--num-query-groups 3", "--num-query-groups 3 must be a multiple or a divisor of --tensor-model-parallel-size 2"),
    (2, f"{TRAIN} --num-query-groups 2", "needs --group-query-attention"),
]


def _refusal(case, tmp_path: Path, index: int) -> str | None:
    """None if the row is refused as it must be, else what went wrong. The first row runs the
    real executable; the others its entry point in this process (see cli_here), ~20 ms each
    instead of a fresh interpreter's ~0.5 s."""
    world, flags, expected = case
    logs = tmp_path / f"logs{index}"
    argv = ["pretrain", "--world", str(world), "--backend", "gloo", "--log-dir", str(logs), *flags.split()]
    if index:
        run = minitron_here(*argv)
    else:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
        run = subprocess.run([MINITRON, *argv], capture_output=True, text=True, env=env, timeout=120)
    lines = run.stderr.strip().splitlines()
    if run.returncode != 2 or len(lines) != 1 or "Traceback" in run.stderr or expected not in lines[0]:
        return f"{flags}\n    exit {run.returncode}, stderr: {run.stderr.strip()[-400:]!r}"
    if logs.exists():
        return f"{flags}\n    refused, but a rank started (its log directory appeared)"
    return None


def test_bad_input_is_one_line_and_starts_nothing(tmp_path):
    # Report every row that fails, not only the first.
    problems = [p for i, case in enumerate(CASES) if (p := _refusal(case, tmp_path, i))]
    assert not problems, "\n".join(problems)


def test_no_number_flag_is_unbounded():
    """The class, not the instances: every int or float flag parses through a type that states
    its range (argument_groups._int / _float), so `--anything -1` cannot slip through."""
    from minitron.training.argument_groups import build_parser

    bare = [a.option_strings[0] for a in build_parser()._actions if a.type in (int, float) and not a.choices]
    assert bare == [], f"flags with an unchecked int/float type: {bare}"
