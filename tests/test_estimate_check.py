"""`minitron estimate --check DIR` on a trace of more than one iteration, and on damaged ones.

One real run serves every test here: `pretrain --trace` of world 4 at tp 2 for two iterations
(real gloo ranks). The estimate is one train_step's bytes, so each iteration must match it on
its own; copies of the trace with one record changed must fail in the way the command promises:
exit 1 when a rank sent other bytes, exit 2 with one line when the trace cannot be checked.
"""

from __future__ import annotations

import json
import shutil

import pytest

from cli_here import run_minitron
from deadline import deadline

RUN = ["--world", "4", "--tp", "2", "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4",
       "--seq-length", "16", "--micro-batch-size", "1", "--global-batch-size", "2", "--train-iters", "2",
       "--lr", "1e-3", "--mock-data", "--vocab-size", "1023", "--distributed-backend", "gloo"]
SET_GLOBALS = "minitron.training.global_vars.set_global_variables"
TRAIN_STEP = "minitron.training.training.train_step"


@pytest.fixture(scope="module")
def two_iterations(tmp_path_factory):
    root = tmp_path_factory.mktemp("estimate-check")
    # In this process (its ranks forked from it, torch already imported): a fresh `minitron`
    # would add an import of torch to a run that only makes the trace these tests read.
    with deadline(300):
        done = run_minitron("pretrain", *RUN, "--log-dir", root / "logs", "--trace", root / "trace", cwd=root,
                            here=True)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return root / "trace"


def _check(trace_dir, *extra):
    return run_minitron("estimate", "--check", trace_dir, *extra, here=True)


def _copy(trace_dir, dest, rank: int, change) -> None:
    """A copy of the trace in ``dest`` whose rank ``rank`` file went through ``change(records)``."""
    shutil.copytree(trace_dir, dest)
    path = dest / f"rank{rank}.jsonl"
    records = [json.loads(line) for line in path.read_text().splitlines()]
    change(records)
    path.write_text("".join(json.dumps(r) + "\n" for r in records))


def _under(records, step) -> list[dict]:
    """The records that ran inside ``step``, by the parent chain."""
    by_id = {r["id"]: r for r in records}

    def inside(r):
        while r is not None and r["id"] != step["id"]:
            r = by_id.get(r["parent"])
        return r is not None
    return [r for r in records if r is not step and inside(r)]


def test_each_iteration_is_compared_with_one_train_step(two_iterations):
    done = _check(two_iterations)
    assert done.returncode == 0, done.stdout + done.stderr   # before: exit 1, every rank "2x" the estimate
    assert "all 4 ranks sent exactly the predicted bytes to every group kind in each of 2 iterations" \
        in " ".join(done.stdout.split())
    report = json.loads(_check(two_iterations, "--json").stdout)
    for rank in report["ranks"]:
        assert [i["iteration"] for i in rank["iterations"]] == [0, 1]
        assert all(i["traced"] == rank["predicted"] for i in rank["iterations"]), rank
        assert rank["predicted"]["tp"] > 0 and rank["match"]


def test_one_iteration_that_sent_other_bytes_exits_1(two_iterations, tmp_path):
    """Rank 2's second iteration hands a doubled tensor to one all-reduce: that rank and that
    iteration differ, and nothing else."""
    def double_one_all_reduce(records):
        second = next(r for r in records if r["name"] == TRAIN_STEP and r["args"]["iteration"] == 1)
        target = next(r for r in _under(records, second) if r["name"].endswith(".all_reduce"))
        target["args"]["shape"][0] *= 2

    _copy(two_iterations, tmp_path / "t", 2, double_one_all_reduce)
    report = json.loads(_check(tmp_path / "t", "--json").stdout)
    assert [r["rank"] for r in report["ranks"] if not r["match"]] == [2]
    rank2 = next(r for r in report["ranks"] if r["rank"] == 2)
    assert [i["match"] for i in rank2["iterations"]] == [True, False]
    done = _check(tmp_path / "t")
    assert done.returncode == 1, done.stdout + done.stderr
    assert "1 of 4 ranks differ from the estimate: [2]" in done.stdout


def _set(key, value):
    return lambda recorded: recorded["args"].__setitem__(key, value)


def _drop(key):
    return lambda recorded: recorded["args"].pop(key)


def _unrecorded(recorded):
    recorded.pop("args")


@pytest.mark.parametrize("change,words", [
    (_unrecorded, "does not record the run's arguments"),
    (_set("tensor_model_parallel_size", "2"), "tensor_model_parallel_size is '2'"),
    (_set("sequence_parallel", 1), "sequence_parallel is 1"),
    (_set("params_dtype", "float8"), "params_dtype is 'float8'"),
    (_drop("data_parallel_size"), "data_parallel_size is None, not a size"),
    (_set("data_parallel_size", 4), "where the layout gives 2"),
    (_set("world_size", 3), "not divisible by"),
    (_set("num_layers", -1), "num_layers is -1"),
    (_set("position_embedding_type", "sinusoid"), "position_embedding_type is 'sinusoid'"),
])
def test_a_damaged_args_record_is_one_line_and_exit_2(two_iterations, tmp_path, change, words):
    """The record is damaged on every rank alike (the reader takes the first it finds)."""
    damaged = tmp_path / "t"
    shutil.copytree(two_iterations, damaged)
    for rank in range(4):
        path = damaged / f"rank{rank}.jsonl"
        records = [json.loads(line) for line in path.read_text().splitlines()]
        for r in records:
            if r["name"] == SET_GLOBALS:
                change(r["args"])
        path.write_text("".join(json.dumps(r) + "\n" for r in records))
    done = _check(damaged)
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
