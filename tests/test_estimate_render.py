"""What `minitron estimate` says beside its tables: the embedding's words follow the model (tied
or not), and a group kind whose groups hold one rank (tp at tp 1) gets no column, since its calls
send nothing. Each answer is the command run in this process: no rank starts."""

from __future__ import annotations

import pytest

from cli_here import run_minitron

MODEL = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "1", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023"]


def estimate(*argv) -> str:
    done = run_minitron("estimate", *argv, *MODEL, env={"COLUMNS": "200"}, here=True)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def comm_columns(out: str) -> list[str]:
    """The column names of the communication table (the first header row after its title)."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if "bytes handed" in line)
    row = next(line for line in lines[start:] if line.startswith("┃"))
    return [cell.strip() for cell in row.strip("┃").split("┃")]


@pytest.mark.parametrize("untie,words", [([], "the tied embedding once"),
                                         (["--untie-embeddings-and-output-weights"],
                                          "the embedding and output layer untied")])
def test_the_model_line_says_whether_the_embedding_is_tied(untie, words):
    out = estimate("--world", "2", "--tp", "2", *untie)
    assert words in out
    assert ("tied embedding" in out) == (not untie)


def test_a_kind_of_groups_of_one_gets_no_column():
    at_tp1 = comm_columns(estimate("--world", "2"))
    assert at_tp1 == ["ranks", "dp-cp"], at_tp1                 # tp and tp-pp: groups of one
    at_tp2 = comm_columns(estimate("--world", "2", "--tp", "2"))
    assert "tp" in at_tp2 and "tp-pp" in at_tp2 and "dp-cp" not in at_tp2, at_tp2
    out = estimate("--world", "2")
    assert "tp, tp-pp: groups of one rank, whose calls send nothing" in out


def test_one_rank_says_no_collective_moves_a_byte():
    out = estimate("--world", "1")
    assert "no collective moves a byte" in out and "bytes handed" not in out
