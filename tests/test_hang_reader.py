"""Open records (issue 41): a blocking call is written as it begins, and the reader pairs it with
its finished record, so complete traces read exactly as before, a killed rank's file still
reads, and the calls in flight come back from read_in_flight. No process is started here."""

from __future__ import annotations

import json

import pytest

from minitron.trace import recorder as rec
from minitron.trace.reader import TraceError, read_in_flight, read_trace

ARGS = {"group": "WORLD", "ranks": "all", "shape": [4], "dtype": "float32"}
OPENED = {"rank": 0, "pid": 1, "id": 0, "parent": None, "name": "x", "args": {}, "start_us": 1, "open": True}


def record_rank(out, rank: int, hang: bool):
    """A rank's file as the recorder writes it: init, a traced step around two all-reduces, the
    second left in flight when ``hang`` (the recorder is dropped unclosed, as a killed rank's)."""
    r = rec.Recorder(out, rank)
    with r.span("torch.distributed.init_process_group", {"world_size": 2, "backend": "gloo"}, blocking=True):
        pass
    step = r.span("minitron.training.training.train_step", {"iteration": 1})
    step.__enter__()
    with r.span("torch.distributed.all_reduce", dict(ARGS), blocking=True):
        pass
    if hang:
        r.begin("torch.distributed.all_reduce", dict(ARGS))
        r.write_open()   # what span(..., blocking=True) does on entry; the call never returns
        return r, step   # kept: a span collected unclosed would record its end (GeneratorExit)
    with r.span("torch.distributed.all_reduce", dict(ARGS), blocking=True):
        pass
    step.__exit__(None, None, None)
    r.close()
    return r, step


def test_a_complete_trace_reads_as_one_without_open_records(tmp_path):
    for rank in (0, 1):
        record_rank(tmp_path, rank, hang=False)
    assert '"open"' not in (tmp_path / "rank0.jsonl").read_text()   # one record per finished call, as ever
    lines = (tmp_path / "entered" / "rank0.jsonl").read_text().splitlines()
    assert sum('"open":true' in line for line in lines) == 4   # init, the step (below a collective), 2 all-reduces
    runs, cut = read_trace(tmp_path)
    assert not cut and [r["name"].rsplit(".", 1)[-1] for r in runs[0]] == \
        ["init_process_group", "train_step", "all_reduce", "all_reduce"]
    assert all("open" not in r for r in runs[0])
    assert read_in_flight(tmp_path)[2] == {0: [], 1: []}


def test_a_killed_rank_leaves_its_calls_in_flight_on_disk(tmp_path):
    record_rank(tmp_path, 0, hang=False)
    hung = record_rank(tmp_path, 1, hang=True)   # not closed: only what was flushed is on disk
    runs, cut, opened = read_in_flight(tmp_path)
    assert [r["name"].rsplit(".", 1)[-1] for r in opened[1]] == ["train_step", "all_reduce"]
    assert opened[1][0]["id"] == opened[1][1]["parent"]   # the step the collective runs in
    assert [r["name"].rsplit(".", 1)[-1] for r in read_trace(tmp_path)[0][1]] == ["init_process_group", "all_reduce"]
    del hung


def test_a_file_of_open_records_only_points_to_view_hang(tmp_path):
    r = rec.Recorder(tmp_path, 0)
    r.begin("torch.distributed.init_process_group", {"world_size": 1})
    r.write_open()
    with pytest.raises(TraceError, match="is empty.*first call.*--hang"):
        read_trace(tmp_path)
    assert read_in_flight(tmp_path)[2][0][0]["name"] == "torch.distributed.init_process_group"


@pytest.mark.parametrize("lines, line, says", [
    ([{"open": True}], 1, "has no rank"),
    ([OPENED] * 2, 2, "also the id of an earlier line"),
    ([{**OPENED, "open": None, "end_us": 2}], 1, 'it has no "open": true'),
    ([{**OPENED, "id": 1, "parent": 1}], 1, "did not begin before call 1"),
])
def test_a_bad_open_record_is_refused_with_its_line(tmp_path, lines, line, says):
    (tmp_path / "rank0.jsonl").write_text(json.dumps({**OPENED, "id": 5, "end_us": 2, "open": None}) + "\n")
    (tmp_path / "entered").mkdir()
    (tmp_path / "entered" / "rank0.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(TraceError, match=f"entered/rank0.jsonl:{line}: .*{says}"):
        read_in_flight(tmp_path)


def test_an_open_record_that_tells_another_call_than_its_finished_one_is_refused(tmp_path):
    (tmp_path / "rank0.jsonl").write_text(json.dumps({**OPENED, "end_us": 2}) + "\n")
    (tmp_path / "entered").mkdir()
    (tmp_path / "entered" / "rank0.jsonl").write_text(json.dumps({**OPENED, "name": "y"}) + "\n")
    with pytest.raises(TraceError, match="different runs"):
        read_in_flight(tmp_path)
