"""`minitron ckpt inspect --pp P` with an uneven target split (issue #36): the resharding plan
asks for the layers each stage of that split builds (layer_layout.py, the model's own rule),
not an even L / (pp·vp) share."""

from __future__ import annotations

import pytest

from minitron.cli.views.ckpt_plan import Target, stage_layers, wanted_pieces

STACKED = "decoder.layers.self_attention.linear_proj.weight"   # one tensor, axis 0 = global layer


@pytest.mark.parametrize("target,per_rank", [
    (Target(1, 2, 1), [[(0, 3)], [(3, 6)]]),
    (Target(1, 2, 1, first=1), [[(0, 1)], [(1, 6)]]),
    (Target(1, 3, 1, last=4), [[(0, 1)], [(1, 2)], [(2, 6)]]),
    (Target(1, 2, 1, embedding=True, loss=True), [[(0, 3)], [(3, 6)]]),   # 8 slots: 3 + 3 layers
    # a layout sets two chunks per rank; rank 0's first chunk holds only the embedding
    (Target(1, 2, 1, layout="E|t*3|t*2|tL"), [[(0, 0), (3, 5)], [(0, 3), (5, 6)]]),
])
def test_stage_layers_follow_the_target_split(target, per_rank):
    assert [stage_layers(6, target, r) for r in range(target.pp)] == per_rank


def test_a_stage_asks_for_its_own_rows_of_the_stack():
    target = Target(1, 2, 1, first=1)
    rows = [wanted_pieces(STACKED, (6, 8, 8), {"num_layers": 6}, target, rank) for rank in range(2)]
    assert rows == [[[(0, 1), (0, 8), (0, 8)]], [[(1, 6), (0, 8), (0, 8)]]]
    # an embedding-only chunk asks for nothing of the stack
    target = Target(1, 2, 1, layout="E|t*3|t*2|tL")
    assert wanted_pieces(STACKED, (6, 8, 8), {"num_layers": 6}, target, 0) == [[(3, 5), (0, 8), (0, 8)]]


def test_split_flags_are_pretrain_s():
    assert Target(1, 2, 1, first=1, loss=False).split_flags() == ["--decoder-first-pipeline-num-layers", "1"]
    assert Target(1, 2, 1, layout="Et|tL").split_flags() == ["--pipeline-model-parallel-layout", "Et|tL"]


@pytest.mark.stress
def test_predicted_bytes_at_an_uneven_target_are_what_a_resume_reads(tmp_path, monkeypatch):
    """A 2-layer model saved at tp 2, resumed at pp 2 with both layers on the first stage."""
    import test_ckpt_cli as cli
    cli._run(tmp_path / "first", 2, cli.MODEL + ["--tensor-model-parallel-size", "2", "--train-iters", "1",
                                                 "--save", str(tmp_path / "ck")])
    layout = ["--pipeline-model-parallel-size", "2", "--pipeline-model-parallel-layout", "Ett|L"]
    real = cli._real_reads(tmp_path, "uneven", 2, layout, monkeypatch)
    _, _, plan = cli.predicted_reads(tmp_path / "ck", Target(1, 2, 1, layout="Ett|L"))
    assert real and {p["rank"]: sum(p["files"].values()) for p in plan} == real
    # the even split's last stage reads layer 2's rows; this one's reads none of the stack
    even = cli.predicted_reads(tmp_path / "ck", Target(1, 2, 1))[2]
    assert sum(even[1]["files"].values()) > sum(plan[1]["files"].values())
