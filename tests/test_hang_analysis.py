"""trace/hang.py on traces written here by the recorder itself (no process started): the
wait-for ring across a tensor x data grid, and a group recorded without its list of ranks."""

from __future__ import annotations

from minitron.trace import recorder as rec
from minitron.trace.hang import _cycle, diagnose

TP = {0: [0, 1], 1: [0, 1], 2: [2, 3], 3: [2, 3]}
DP = {0: [0, 2], 1: [1, 3], 2: [0, 2], 3: [1, 3]}


def hung_rank(out, rank: int, group: str, ranks, world: int = 4):
    """A rank that initialized, then entered one all-reduce on ``group`` and never left it."""
    r = rec.Recorder(out, rank)
    with r.span("torch.distributed.init_process_group", {"world_size": world, "backend": "gloo"}, blocking=True):
        pass
    r.begin("torch.distributed.all_reduce", {"group": group, "ranks": ranks, "shape": [2], "dtype": "float32"})
    r.write_open()
    return r


def test_four_ranks_that_each_wait_on_a_different_group_are_one_ring(tmp_path):
    # ranks 0 and 3 all-reduce on their tensor group first, ranks 1 and 2 on their data group
    kept = [hung_rank(tmp_path, rank, *(("TENSOR_MODEL_PARALLEL_GROUP", TP[rank]) if rank in (0, 3)
                                        else ("DATA_PARALLEL_GROUP", DP[rank]))) for rank in range(4)]
    d = diagnose(tmp_path)
    assert d["cycle"] == [0, 1, 3, 2, 0] and not d["divergences"]
    assert sorted((s["group"], tuple(s["ranks"]), tuple(s["never_entered"])) for s in d["stuck"]) == [
        ("DATA_PARALLEL_GROUP", (0, 2), (0,)), ("DATA_PARALLEL_GROUP", (1, 3), (3,)),
        ("TENSOR_MODEL_PARALLEL_GROUP", (0, 1), (1,)), ("TENSOR_MODEL_PARALLEL_GROUP", (2, 3), (2,))]
    del kept


def test_a_group_recorded_without_its_ranks_counts_the_ranks_that_called_on_it(tmp_path):
    kept = [hung_rank(tmp_path, rank, "EXPERT_DATA_PARALLEL_GROUP", "128 ranks", world=2) for rank in range(2)]
    (s,) = diagnose(tmp_path)["stuck"]
    assert s["ranks"] == [0, 1] and s["inside"] == {"0": "all_reduce", "1": "all_reduce"}
    del kept


def test_the_ring_is_found_past_a_rank_that_waits_for_nobody():
    assert _cycle({0: {1, 2}, 1: set(), 2: {0}}) == [0, 2, 0]
    assert _cycle({0: {1}, 1: set()}) is None
