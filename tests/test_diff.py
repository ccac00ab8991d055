"""`minitron diff A B`: two trace directories side by side, from the records alone.

The traces here are written by hand, a few records each, so every expected number can be read
off the records: which groups, which collectives with which tensors, which calls one run lacks.
"""

from __future__ import annotations

import json
import sys

import pytest

from minitron.cli.views.diff import call_bytes, comm_by_key, summarize

TS = "minitron.training.training.train_step"


def write_run(path, world, tp, pp, p2p: bool):
    """``world`` ranks: tp groups of neighbours, one train_step holding one all-reduce on the tp
    group ([4, 8] float32), and with ``p2p`` a batch of one send [2, 3] bf16 and one receive."""
    path.mkdir()
    for rank in range(world):
        tp_group = [r for r in range(world) if r // tp == rank // tp]
        records = [
            {"name": "torch.distributed.init_process_group", "args": {"backend": "gloo", "world_size": world}},
            {"name": "minitron.core.parallel_state.initialize_model_parallel",
             "args": {"tensor_model_parallel_size": tp, "pipeline_model_parallel_size": pp}},
            {"name": "torch.distributed.new_group", "args": {"ranks": tp_group, "member": True,
                                                             "group_desc": "TENSOR_MODEL_PARALLEL_GROUP"}},
            {"name": TS, "args": {"iteration": 0}},
            {"name": "torch.distributed.all_reduce", "parent": 3,
             "args": {"shape": [4, 8], "dtype": "float32", "group": "TENSOR_MODEL_PARALLEL_GROUP", "ranks": tp_group}},
        ]
        if p2p:
            records.append({"name": "torch.distributed.batch_isend_irecv", "parent": 3, "args": {
                "ops": [{"op": "isend", "peer": 0, "shape": [2, 3], "dtype": "bfloat16"},
                        {"op": "irecv", "peer": 0, "shape": [2, 3], "dtype": "bfloat16"}],
                "group": "PIPELINE_MODEL_PARALLEL_GROUP", "ranks": [0, 1]}})
        with open(path / f"rank{rank}.jsonl", "w") as f:
            for i, r in enumerate(records):
                start = 10 * i if r.get("parent") is None else 31 + i
                end = 100 if r["name"] == TS else start + 1
                f.write(json.dumps({"rank": rank, "pid": 100 + rank, "id": i, "parent": r.get("parent"),
                                    "start_us": start, "end_us": end, **r}) + "\n")
    return path


def test_bytes_of_a_call():
    assert call_bytes({"args": {"shape": [4, 8], "dtype": "float32"}}) == 128
    assert call_bytes({"args": {"shape": [], "dtype": "float32"}}) == 4      # a scalar
    ops = [{"op": "isend", "shape": [2, 3], "dtype": "bfloat16"}, {"op": "irecv", "shape": [9], "dtype": "float32"}]
    assert call_bytes({"args": {"ops": ops}}) == 12                         # sends only
    assert call_bytes({"args": {"ops": [{"op": "isend", "shape": [5]}]}}, "float16") == 10  # older traces
    assert call_bytes({"args": {"shape": [7, 4], "input_shape": [3, 4], "dtype": "float32"}}) == 48  # all-to-all
    # a dtype the table does not know: a send counts as a collective of that dtype does, no KeyError
    unknown = call_bytes({"args": {"shape": [5], "dtype": "float8_e4m3fn"}})
    assert call_bytes({"args": {"ops": [{"op": "isend", "shape": [5], "dtype": "float8_e4m3fn"}]}}) == unknown


def test_summaries_count_what_the_records_say(tmp_path):
    a = write_run(tmp_path / "a", 4, 2, 2, p2p=True)
    from minitron.trace.reader import load_trace
    runs = load_trace(a)
    assert comm_by_key(runs[0]) == {"tp": [128, 1], "pp": [12, 1]}
    s = summarize(runs)
    assert s["groups"] == {"tp": {(0, 1), (2, 3)}}
    assert s["comm"] == {"tp": [4 * 128, 4], "pp": [4 * 12, 4]}
    assert s["calls"]["batch_isend_irecv @ pp"] == 4 and s["phases"]["train_step"] == 70


def test_diff_shows_both_runs_and_what_only_one_does(tmp_path, capsys, monkeypatch):
    from minitron.cli import main

    # A path wider than the console, whatever the temporary folder's own length: each run's
    # line must still be one line, the path unbroken (rich would wrap it; the command asks not to).
    a = write_run(tmp_path / ("a" * 130), 4, 2, 2, p2p=True)
    b = write_run(tmp_path / "b", 4, 4, 1, p2p=False)
    monkeypatch.setattr(sys, "argv", ["minitron", "diff", str(a), str(b)])
    monkeypatch.setenv("COLUMNS", "120")
    with pytest.raises(SystemExit) as stop:
        main()
    out = capsys.readouterr().out
    assert stop.value.code == 0, out
    first, second = out.splitlines()[:2]
    assert first.startswith(f"A = {a}: 4 ranks: tp 2 × pp 2") and second.startswith(f"B = {b}: 4 ranks: tp 4 × pp 1"), out
    groups = out[:out.index("collectives and sends")]
    tp_row = next(line for line in groups.splitlines() if line.startswith("│ tp "))
    assert "2 × 2" in tp_row and "1 × 4" in tp_row                # groups: 2 of 2 ranks, 1 of 4
    assert "512 B" in out and "48 B" in out                         # tp bytes in both, pp in A only
    only = out[out.index("one run only"):]
    assert "batch_isend_irecv @ pp" in only and "all_reduce @ tp" not in only


@pytest.mark.parametrize("argv,words", [
    (["diff", "/nonexistent-a", "/nonexistent-b"], "/nonexistent-a holds no rank*.jsonl files: it does not exist"),
    (["diff", "/tmp"], "Missing argument"),
])
def test_bad_input_is_one_line(capsys, monkeypatch, argv, words):
    from minitron.cli import main

    monkeypatch.setattr(sys, "argv", ["minitron", *argv])
    with pytest.raises(SystemExit) as stop:
        main()
    err = capsys.readouterr().err
    assert stop.value.code == 2 and words in err and len(err.strip().splitlines()) == 1, err
