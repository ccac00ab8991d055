"""What `minitron pretrain` prints: Megatron's per-iteration line, parameters per (tensor,
pipeline) rank, the padded vocabulary, a closing summary; plain lines when stdout is a pipe.

One real run (4 ranks: tp 2 x pp 2, 4 iterations, a line every 2) feeds most of the checks;
its numbers are checked against the per-iteration records and against a serial model.
"""

from __future__ import annotations

import os
import json
import re
from argparse import Namespace

import pytest

from distributed import run_ranks
from cli_here import run_minitron
from deadline import deadline

TP, PP, LAYERS, HIDDEN, HEADS, SEQ = 2, 2, 2, 32, 4, 32
VOCAB = 1024  # NullTokenizer adds the end-of-document id: 1025 tokens
RUN = ["pretrain", "--world", str(TP * PP), "--tensor-model-parallel-size", str(TP),
       "--pipeline-model-parallel-size", str(PP), "--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN),
       "--num-attention-heads", str(HEADS), "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
       "--micro-batch-size", "2", "--global-batch-size", "4", "--train-iters", "4", "--log-interval", "2",
       "--lr", "1e-3", "--mock-data", "--vocab-size", str(VOCAB)]


def _round_up(n: int, multiple: int) -> int:
    return (n + multiple - 1) // multiple * multiple


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    logs = tmp_path_factory.mktemp("pretrain") / "logs"
    # In this process (its ranks forked from it, torch already imported): the ranks write only to
    # their logs, and everything `pretrain` prints comes from this process, captured as a pipe.
    with deadline(300):
        done = run_minitron(*RUN, "--log-dir", str(logs), env=dict(os.environ), here=True)  # stdout: a pipe
    assert done.returncode == 0, done.stdout + done.stderr
    records = [json.loads(line) for line in open(logs / "iterations.jsonl")]
    return done.stdout, records, logs


def _fields(line: str) -> dict:
    """' [time] iteration 2/ 4 | key: value | ...' -> {key: value}"""
    parts = [p.strip() for p in line.split("|") if p.strip()]
    m = re.fullmatch(r"\[[\d\- :]+\] iteration\s+(\d+)/\s*(\d+)", parts[0])
    assert m, parts[0]
    out = {"iteration": int(m[1]), "train iters": int(m[2])}
    for part in parts[1:]:
        key, value = part.rsplit(": ", 1)
        out[key] = float(value)
    return out


def test_iteration_lines_are_megatrons_and_match_the_records(run):
    stdout, records, logs = run
    lines = [line for line in stdout.splitlines() if re.match(r" \[[\d\- :]+\] iteration ", line)]
    assert [_fields(line)["iteration"] for line in lines] == [2, 4]  # --log-interval 2
    keys = ["iteration", "train iters", "consumed samples", "elapsed time per iteration (ms)", "learning rate",
            "global batch size", "lm loss", "loss scale", "grad norm", "number of skipped iterations",
            "number of nan iterations"]
    by_iteration = {r["iteration"]: r for r in records}
    for line in lines:
        f = _fields(line)
        assert list(f) == keys, line  # Megatron's fields, in Megatron's order
        rec, prev = by_iteration[f["iteration"]], by_iteration[f["iteration"] - 1]
        assert f["train iters"] == 4 and f["global batch size"] == rec["global_batch_size"] == 4
        assert f["consumed samples"] == rec["consumed_samples"] == 4 * f["iteration"]
        assert f["learning rate"] == float(f"{rec['lr']:.6E}")
        assert f["loss scale"] == rec["loss_scale"] and f["grad norm"] == round(rec["grad_norm"], 3)
        # Loss and time cover the interval: the mean over its two iterations.
        assert f["lm loss"] == float(f"{(rec['lm_loss'] + prev['lm_loss']) / 2:.6E}")
        assert abs(f["elapsed time per iteration (ms)"] - (rec["elapsed_ms"] + prev["elapsed_ms"]) / 2) <= 0.051
        assert f["number of skipped iterations"] == f["number of nan iterations"] == 0
    # The console shows what the last rank printed, character for character.
    rank_log = (logs / f"rank{TP * PP - 1}.log").read_text().splitlines()
    assert all(line in rank_log for line in lines)


def _serial_parameters(rank: int):
    """The tp=1, pp=1 model with the run's padded vocabulary: (name, numel, split across tp)."""
    from minitron.core.models.gpt import GPTModel
    from minitron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from minitron.core.transformer import TransformerConfig

    model_parallel_cuda_manual_seed(1)
    config = TransformerConfig(num_layers=LAYERS, hidden_size=HIDDEN, num_attention_heads=HEADS)
    model = GPTModel(config, vocab_size=_round_up(VOCAB + 1, 128 * TP), max_sequence_length=SEQ,
                     share_embeddings_and_output_weights=True)
    return [(name, p.numel(), bool(getattr(p, "tensor_model_parallel", False)))
            for name, p in model.named_parameters()]


def test_parameters_per_tensor_pipeline_rank(run):
    stdout, _, _ = run
    found = {(int(t), int(p)): int(n) for t, p, n in re.findall(
        r"^ > number of parameters on \(tensor, pipeline\) model parallel rank \((\d+), (\d+)\): (\d+)$",
        stdout, re.M)}
    # Expected, from the serial model: each stage holds its layers (embedding first, final norm and
    # output layer last), a tensor-parallel weight a 1/tp slice; with the output layer tied to the
    # embedding, the last stage keeps its own copy of the word embeddings.
    expected = {(t, p): 0 for t in range(TP) for p in range(PP)}
    serial = run_ranks(_serial_parameters, world_size=1)[0]
    for name, numel, split in serial:
        layer = re.match(r"decoder\.layers\.(\d+)\.", name)
        stage = int(layer[1]) // (LAYERS // PP) if layer else 0 if name.startswith("embedding.") else PP - 1
        copies = [stage, PP - 1] if name == "embedding.word_embeddings.weight" and PP > 1 else [stage]
        for p in copies:
            for t in range(TP):
                expected[(t, p)] += numel // TP if split else numel
    assert found == expected


def test_padded_vocabulary_line_and_note(run):
    stdout, _, _ = run
    size, padded, serial = VOCAB + 1, _round_up(VOCAB + 1, 128 * TP), _round_up(VOCAB + 1, 128)
    assert (padded, serial) == (1280, 1152)
    assert f" > padded vocab (size: {size}) with {padded - size} dummy tokens (new size: {padded})" in stdout
    note = [line for line in stdout.splitlines() if line.startswith(" > note: the serial model")]
    assert len(note) == 1 and f"to {serial}, not {padded}" in note[0]


def test_no_note_when_the_padding_agrees(capsys):
    from minitron.training.training_log import print_vocab_padding

    args = Namespace(padded_vocab_size=1024, make_vocab_size_divisible_by=128, tensor_model_parallel_size=2)
    print_vocab_padding(args, Namespace(vocab_size=1001))
    assert capsys.readouterr().out == " > padded vocab (size: 1001) with 23 dummy tokens (new size: 1024)\n"


def test_piped_output_is_plain_and_ends_with_a_summary(run):
    stdout, records, logs = run
    assert "\x1b" not in stdout and "\r" not in stdout  # no progress bar, no colour codes
    summary = stdout.splitlines()[-4:]
    assert summary[0].startswith(f"4 iterations on {TP * PP} ranks in ")
    assert summary[1] == (f"lm loss {records[0]['lm_loss']:.4f} (iteration 1) -> "
                          f"{records[-1]['lm_loss']:.4f} (iteration 4)")
    seconds = sum(r["elapsed_ms"] for r in records[1:]) / 1000   # the first iteration, the warm-up, left out
    assert summary[2].startswith(f"iterations 2-4: {3 * 4 * SEQ / seconds:.0f} tokens/s, ")
    assert str(logs / "iterations.jsonl") in summary[3] and f"{logs}/rank{{0..{TP * PP - 1}}}.log" in summary[3]
