"""`minitron trace --backend fake --ranks`: a few ranks of a world, played alone (issue 30).

A rank's groups follow from the layout, and a fake collective needs no peer, so a chosen rank
played without the others must leave exactly the trace it leaves in a full play: the same
new_group calls, the same count of calls answered unrecorded. World 64 here, against a full
play of it; the stress tests go to 2048 ranks, and to 131,072 against the arithmetic.
The partial trace says which ranks it holds, and the reader holds it to that.
"""

from __future__ import annotations

import json
import shutil

import pytest

from cli_here import minitron_here

from minitron.trace.reader import TraceError, load_trace, played_ranks
from minitron.trace.schema import NEW_GROUP, PLAYED

LAYOUT = dict(tp=2, pp=4, cp=2, ep=2)   # world 64: dp 4, every kind of group, embeddings split
CHOSEN = [0, 13, 40, 41, 63]            # first stage, last stage, a middle pair, the last rank


def play(world: int, out, ranks=None, layout=LAYOUT, processes=2) -> dict:
    """The fake play `minitron trace` makes, in this process's forked copies: rank -> records."""
    from minitron.cli.trace import _records_and_rows, play_pretrain_rank, pretrain_argv
    from minitron.launcher.fake import play_ranks

    argv = pretrain_argv(layout["tp"], layout["pp"], layout["cp"], layout["ep"], None, "tp-cp-ep-dp-pp", "fake", [])
    kept = play_ranks(world, lambda: play_pretrain_rank(argv), out, ranks=ranks, processes=processes,
                      keep=_records_and_rows)
    return {rank: records for rank, (records, _) in kept.items()}


def what_a_rank_did(records: list[dict]) -> tuple:
    """Its calls by name in order, its new_group calls, and the calls it only counted."""
    played = next(r for r in records if r["name"] == PLAYED)["args"]
    return ([r["name"] for r in records],
            [(r["args"]["ranks"], r["args"]["group_desc"], r["args"]["backend"]) for r in records
             if r["name"] == NEW_GROUP],
            played["unrecorded_new_groups"])


@pytest.fixture(scope="module")
def plays(tmp_path_factory):
    """A full play of world 64 and a play of CHOSEN alone: (full runs, partial dir)."""
    root = tmp_path_factory.mktemp("fake_ranks")
    full = play(64, root / "full")
    play(64, root / "some", ranks=CHOSEN, processes=1)   # here: five ranks are not worth a fork
    return full, root / "some"


def test_chosen_ranks_played_alone_do_what_they_do_in_a_full_play(plays):
    full, some = plays
    runs = load_trace(some)   # the reader's checks pass: the files are the ranks it says it holds
    assert list(runs) == CHOSEN and played_ranks(runs) == CHOSEN and played_ranks(full) is None
    for rank in CHOSEN:
        assert what_a_rank_did(runs[rank]) == what_a_rank_did(full[rank]), rank
    # Each rank walked every group of the world: its kept groups plus the counted ones.
    _, groups, counted = what_a_rank_did(runs[13])
    assert len(groups) + sum(counted.values()) == sum(1 for r in full[0] if r["name"] == NEW_GROUP) + \
        sum(what_a_rank_did(full[0])[2].values())
    assert counted["TENSOR_MODEL_PARALLEL_GROUP"] == 31 and counted["EMBEDDING_GROUP"] == 15


def test_a_rank_layout_from_its_digits_is_its_part_of_the_whole_layout():
    from minitron.core.group_layout import layout, rank_layout

    for world, tp, pp, cp, ep, order in ((64, 2, 4, 2, 2, "tp-cp-ep-dp-pp"), (64, 4, 2, 1, 8, "tp-cp-ep-dp-pp"),
                                         (48, 2, 3, 2, 1, "tp-cp-ep-dp-pp"), (32, 2, 2, 2, 2, "tp-cp-ep-pp-dp")):
        whole = layout(world, tp, pp, cp, ep, order)
        for rank in range(world):
            mine = {key: g for key, groups in whole.items() for g in groups if rank in g}
            assert rank_layout(rank, world, tp, pp, cp, ep, order) == mine, (world, order, rank)


def _copy(src, dst):
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("trace.json"))
    return dst


def _edit_played(path, change):
    lines = path.read_text().splitlines()
    record = json.loads(lines[-1])
    assert record["name"] == PLAYED
    change(record["args"])
    path.write_text("\n".join(lines[:-1] + [json.dumps(record)]) + "\n")


def test_a_partial_trace_holds_exactly_the_ranks_it_says(plays, tmp_path):
    _, some = plays
    missing = _copy(some, tmp_path / "missing")
    (missing / "rank40.jsonl").unlink()
    with pytest.raises(TraceError, match="rank 40 was played, but the directory holds no rank40.jsonl"):
        load_trace(missing)
    stray = _copy(some, tmp_path / "stray")
    _edit_played(stray / "rank63.jsonl", lambda a: a.update(ranks=[0, 13, 40, 41]))
    with pytest.raises(TraceError, match="ranks played differ"):
        load_trace(stray)
    outside = _copy(some, tmp_path / "outside")
    for rank in CHOSEN:
        _edit_played(outside / f"rank{rank}.jsonl", lambda a: a.update(ranks=CHOSEN + [64]))
    with pytest.raises(TraceError, match="rank 64 was played, outside the world of 64"):
        load_trace(outside)
    unsorted = _copy(some, tmp_path / "unsorted")
    _edit_played(unsorted / "rank0.jsonl", lambda a: a.update(ranks=[13, 0]))
    with pytest.raises(TraceError, match="rank0.jsonl:.*ascending, each once"):
        load_trace(unsorted)


def test_view_diff_and_estimate_read_a_partial_trace(plays, tmp_path):
    _, some = plays
    some = _copy(some, tmp_path / "some")
    shown = minitron_here("view", str(some), "--rank", "40", env={"COLUMNS": "200"})
    assert shown.returncode == 0, shown.stderr
    assert "5 of 64 ranks, played by choice (fake" in shown.stdout
    counted = sum(what_a_rank_did(load_trace(some)[40])[2].values())
    assert f"play_rank  world 64, played [0,13,40,41,63]; {counted} others' new_group calls counted only" \
        in shown.stdout
    assert "new_group ×32 TENSOR_MODEL_PARALLEL_GROUP [40,41] +31 counted" in shown.stdout
    assert "✓ groups match the layout: files of 5 of the 64 ranks" in shown.stdout
    compared = minitron_here("diff", str(some), str(some))
    assert compared.returncode == 0, compared.stderr
    checked = minitron_here("estimate", "--check", str(some))   # no iteration in it: one line, exit 2
    assert checked.returncode == 2 and len(checked.stderr.strip().splitlines()) == 1, checked.stderr
    assert "train" in checked.stderr



def test_svg_of_a_partial_trace_draws_the_nodes_of_the_shown_ranks_executed_groups(plays, tmp_path):
    import re

    from minitron.cli.views.trace_pictures import write_pictures
    from minitron.core.group_layout import rank_layout

    _, some = plays
    [picture] = write_pictures(tmp_path, load_trace(some), 40)
    own = rank_layout(40, 64, **LAYOUT)
    panels = dict(re.findall(r'<g data-kind="(\w+)" data-nodes="(\d+)">', picture.read_text()))
    assert picture.name == "nodes.svg" and panels   # the groups that leave rank 40's node of 8
    assert all(int(n) == len({r // 8 for r in own[kind]}) > 1 for kind, n in panels.items())


# --- production sizes: out of the default run (pytest -m stress) ------------------------------

@pytest.mark.stress
def test_chosen_ranks_of_2048_do_what_they_do_in_a_full_play(tmp_path):
    layout = dict(tp=8, pp=8, cp=2, ep=4)
    chosen = [0, 1, 777, 1024, 2047]
    full = play(2048, tmp_path / "full", layout=layout)   # ~50 s of CPU, 1.2 GB: the full play's limit
    some = play(2048, tmp_path / "some", ranks=chosen, layout=layout)
    assert list(load_trace(tmp_path / "some")) == chosen
    for rank in chosen:
        assert what_a_rank_did(some[rank]) == what_a_rank_did(full[rank]), rank


@pytest.mark.stress
def test_chosen_ranks_of_131072_keep_the_groups_the_layout_gives(tmp_path):
    """No full play of 131,072 ranks is possible here: the arithmetic is the reference."""
    from minitron.cli.views.checks import check_trace
    from minitron.core.rank_generator import DESC_TO_KEY
    from minitron.core.group_layout import rank_layout

    layout = dict(tp=8, pp=16, cp=2, ep=8)
    chosen = [12345, 131071]
    runs = play(131072, tmp_path, ranks=chosen, layout=layout)
    assert load_trace(tmp_path) == runs
    for rank in chosen:
        _, groups, counted = what_a_rank_did(runs[rank])
        kept = {DESC_TO_KEY[desc]: ranks for ranks, desc, _ in groups if desc in DESC_TO_KEY}
        assert kept == rank_layout(rank, 131072, **layout)
        assert counted["TENSOR_MODEL_PARALLEL_GROUP"] == 131072 // 8 - 1
    assert [c.ok for c in check_trace(runs)] == [True, None, True]


def test_the_layout_check_names_a_wrong_group_and_a_missing_one(plays):
    """The layout check looks for a missing group only once a rank kept a wrong one (a rank
    that kept each of its own created it): both failures must still be named."""
    from minitron.cli.views.checks import _layout

    full, _ = plays
    tp = "TENSOR_MODEL_PARALLEL_GROUP"
    group = next(r["args"]["ranks"] for r in full[13] if r["args"].get("group_desc") == tp)

    def without(dropping):   # the trace, as if the ranks ``dropping`` had not made rank 13's tensor group
        return {rank: [r for r in records if rank not in dropping or r["args"].get("group_desc") != tp
                       or r["args"]["ranks"] != group] for rank, records in full.items()}

    assert _layout(full).ok is True
    check = _layout(without({13}))   # its peer made it
    assert check.ok is False and check.detail == "rank 13 joined no 'tp' group"
    check = _layout(without(set(group)))   # nobody did
    assert check.ok is False and check.detail.startswith(f"missing [('tp', {group})")


def test_the_layout_check_uses_the_expert_tensor_parallel_size_the_run_was_given(tmp_path):
    """Megatron's CI case gpt3_mcore_te_tp2_pp2_cp2_etp4_dp_last: tp 2, pp 2, cp 2 and expert tp
    4 in order tp-cp-ep-pp-dp. The check rebuilds the layout from initialize_model_parallel's
    record; with tp's size in place of the expert tp it found expert dp 2 against dense dp 1
    and stopped with a traceback. The run's own expert tp gives both 1, and the groups match."""
    done = minitron_here("trace", "--backend", "fake", "--world", "8", "--ranks", "0,4,7", "--show", "checks",
                         "--out", str(tmp_path / "t"), "--", "--num-layers", "4", "--hidden-size", "64",
                         "--num-attention-heads", "4", "--seq-length", "64", "--micro-batch-size", "1",
                         "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
                         "--context-parallel-size", "2", "--sequence-parallel", "--use-tp-pp-dp-mapping",
                         "--expert-tensor-parallel-size", "4", env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "✓ groups match the layout" in done.stdout


def test_trace_sizes_the_experts_by_the_flags_after_the_double_dash(tmp_path):
    """Megatron's CI case gpt3_mcore_te_tp2_pp1_te_8experts_etp1_ep4: tp 2, ep 4, expert tp 1 on
    4 ranks. trace's early layout check took the expert tp to be tp's (2) and refused the world
    as not divisible by 2 x 4; the flags after `--` say 1, which divides it."""
    done = minitron_here("trace", "--backend", "fake", "--world", "4", "--ranks", "0,3", "--show", "checks",
                         "--out", str(tmp_path / "t"), "--", "--num-layers", "2", "--hidden-size", "64",
                         "--num-attention-heads", "4", "--seq-length", "64", "--micro-batch-size", "1",
                         "--tensor-model-parallel-size", "2", "--num-experts", "8", "--expert-model-parallel-size",
                         "4", "--expert-tensor-parallel-size", "1", "--sequence-parallel", "--disable-bias-linear",
                         env={"COLUMNS": "200"})
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "✓ groups match the layout" in done.stdout
