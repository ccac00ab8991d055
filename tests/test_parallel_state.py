"""parallel_state on real gloo ranks: every getter says what Megatron's layout predicts.

All four layouts run in one launch of 8 ranks (a module-scoped fixture), one after another:
each is destroyed before the next is initialised, as Megatron's own tests do between layouts,
and several tests read different parts of what the ranks reported. The expected values come from
tests/megatron_reference.py, never from minitron.
"""

from __future__ import annotations

import pytest

from distributed import run_ranks
from megatron_reference import EXTRA_KINDS, KINDS, group_of, reference_layout

ALL_KINDS = KINDS + EXTRA_KINDS


def snapshot(rank: int, vp: int | None = None) -> dict:
    """What this rank's parallel_state says, plus one real all_reduce per group it is in."""
    import torch
    import torch.distributed as dist
    from minitron.core import parallel_state as ps

    s = {
        "initialized": ps.model_parallel_is_initialized(),
        "tp_size": ps.get_tensor_model_parallel_world_size(), "tp_rank": ps.get_tensor_model_parallel_rank(),
        "pp_size": ps.get_pipeline_model_parallel_world_size(), "pp_rank": ps.get_pipeline_model_parallel_rank(),
        "dp_size": ps.get_data_parallel_world_size(), "dp_rank": ps.get_data_parallel_rank(),
        "dpcp_size": ps.get_data_parallel_world_size(with_context_parallel=True),
        "dpcp_rank": ps.get_data_parallel_rank(with_context_parallel=True),
        "cp_size": ps.get_context_parallel_world_size(), "cp_rank": ps.get_context_parallel_rank(),
        "ep_size": ps.get_expert_model_parallel_world_size(), "ep_rank": ps.get_expert_model_parallel_rank(),
        "tp_src": ps.get_tensor_model_parallel_src_rank(), "dp_src": ps.get_data_parallel_src_rank(),
        "dpcp_src": ps.get_data_parallel_src_rank(with_context_parallel=True),
        "pp_first": ps.get_pipeline_model_parallel_first_rank(),
        "pp_last": ps.get_pipeline_model_parallel_last_rank(),
        "pp_next": ps.get_pipeline_model_parallel_next_rank(),
        "pp_prev": ps.get_pipeline_model_parallel_prev_rank(),
        "first_stage": ps.is_pipeline_first_stage(ignore_virtual=True),
        "last_stage": ps.is_pipeline_last_stage(ignore_virtual=True),
        "in_embd": ps.is_rank_in_embedding_group(ignore_virtual=True),
        "in_pos_embd": ps.is_rank_in_position_embedding_group(),
        "vp_size": ps.get_virtual_pipeline_model_parallel_world_size(),
        "vp_rank": ps.get_virtual_pipeline_model_parallel_rank(),
        "global_ranks": {}, "torch_ranks": {}, "sums": {},
    }
    for kind in ALL_KINDS:
        try:
            s["global_ranks"][kind] = list(ps.get_global_ranks(kind))
        except (KeyError, RuntimeError):
            s["global_ranks"][kind] = None  # not a member (embedding groups)
            continue
        group = ps.get_group(kind)
        s["torch_ranks"][kind] = dist.get_process_group_ranks(group)
        value = torch.tensor([float(rank + 1)])
        dist.all_reduce(value, group=group)
        s["sums"][kind] = int(value.item())
    # The getters by Megatron's names must hand out the same groups, and really communicate.
    named = {"tp": ps.get_tensor_model_parallel_group(), "pp": ps.get_pipeline_model_parallel_group(),
             "dp": ps.get_data_parallel_group(), "dp-cp": ps.get_data_parallel_group(with_context_parallel=True),
             "cp": ps.get_context_parallel_group(), "tp-pp": ps.get_model_parallel_group(),
             "tp-dp": ps.get_tensor_and_data_parallel_group(),
             "tp-dp-cp": ps.get_tensor_and_data_parallel_group(with_context_parallel=True),
             "tp-cp": ps.get_tensor_and_context_parallel_group(), "ep": ps.get_expert_model_parallel_group(),
             "expt-tp": ps.get_expert_tensor_parallel_group(),
             "tp-ep": ps.get_expert_tensor_and_model_parallel_group(),
             "expt-dp": ps.get_expert_data_parallel_group(), "dp-gloo": ps.get_data_parallel_group_gloo()}
    s["named_ranks"] = {k: dist.get_process_group_ranks(g) for k, g in named.items()}
    value = torch.tensor([float(rank + 1)])
    dist.all_reduce(value, group=ps.get_tensor_model_parallel_group())
    s["tp_allreduce"] = int(value.item())
    if vp is not None:
        # Ask about each model chunk by name (vp_stage), as the interleaved schedule does.
        s["virtual"] = []
        for chunk in range(vp):
            s["virtual"].append((chunk,
                                 ps.is_pipeline_first_stage(ignore_virtual=False, vp_stage=chunk),
                                 ps.is_pipeline_last_stage(ignore_virtual=False, vp_stage=chunk),
                                 ps.is_rank_in_embedding_group(ignore_virtual=False, vp_stage=chunk),
                                 ps.is_pipeline_first_stage(vp_stage=chunk),  # default: ignore_virtual
                                 ps.is_pipeline_last_stage(vp_stage=chunk)))
        # Current Megatron's defaults: ignore_virtual=True, so no argument asks about the rank.
        s["defaults"] = (ps.is_pipeline_first_stage(), ps.is_pipeline_last_stage(), ps.is_rank_in_embedding_group())
        s["no_vp_stage"] = []
        for ask in (ps.is_pipeline_first_stage, ps.is_pipeline_last_stage, ps.is_rank_in_embedding_group):
            try:
                ask(ignore_virtual=False)
                s["no_vp_stage"].append("accepted")
            except ValueError as exc:
                s["no_vp_stage"].append("vp_stage" in str(exc))
    return s


def expected(rank: int, world: int, tp: int, pp: int, cp: int = 1, ep: int = 1, vp: int | None = None) -> dict:
    lay = reference_layout(world, tp, pp, cp, ep)
    mine = {k: group_of(lay[k], rank) for k in ALL_KINDS}
    pipe = mine["pp"]
    at = pipe.index(rank)
    return {
        "initialized": True,
        "tp_size": tp, "tp_rank": mine["tp"].index(rank),
        "pp_size": pp, "pp_rank": at,
        "dp_size": world // (tp * pp * cp), "dp_rank": mine["dp"].index(rank),
        "dpcp_size": world // (tp * pp), "dpcp_rank": mine["dp-cp"].index(rank),
        "cp_size": cp, "cp_rank": mine["cp"].index(rank),
        "ep_size": ep, "ep_rank": mine["ep"].index(rank),
        "tp_src": mine["tp"][0], "dp_src": mine["dp"][0], "dpcp_src": mine["dp-cp"][0],
        "pp_first": pipe[0], "pp_last": pipe[-1],
        "pp_next": pipe[(at + 1) % pp], "pp_prev": pipe[(at - 1) % pp],  # wraps around
        "first_stage": at == 0, "last_stage": at == pp - 1,
        "in_embd": mine["embd"] is not None, "in_pos_embd": mine["pos-embd"] is not None,
        "vp_size": vp, "vp_rank": 0 if vp else None,
        "global_ranks": mine,
        "torch_ranks": {k: sorted(g) for k, g in mine.items() if g is not None},  # torch sorts
        "sums": {k: sum(r + 1 for r in g) for k, g in mine.items() if g is not None},
        "named_ranks": {**{k: mine[k] for k in ("tp", "pp", "dp", "dp-cp", "cp", "tp-pp", "tp-dp",
                                                 "tp-dp-cp", "tp-cp", "ep", "expt-tp", "tp-ep", "expt-dp")},
                        "dp-gloo": mine["dp"]},
        "tp_allreduce": sum(r + 1 for r in mine["tp"]),
    }


def expected_virtual(rank: int, world: int, tp: int, pp: int, vp: int) -> list[tuple]:
    """Megatron: with a virtual pipeline, the first stage is pipeline rank 0 *and* chunk 0, the
    last is the last rank *and* the last chunk; embedding ranks hold it only on those chunks."""
    lay = reference_layout(world, tp, pp)
    pipe, embd = group_of(lay["pp"], rank), group_of(lay["embd"], rank)
    at = pipe.index(rank)
    rows = []
    for chunk in range(vp):
        first, last = at == 0 and chunk == 0, at == pp - 1 and chunk == vp - 1
        in_embd = embd is not None and (first if rank == embd[0] else last if rank == embd[-1] else True)
        rows.append((chunk, first, last, in_embd, at == 0, at == pp - 1))
    return rows


def compare(got: list[dict], world: int, **sizes) -> None:
    for rank, snap in enumerate(got):
        want = expected(rank, world, **sizes)
        for key, value in want.items():
            assert snap[key] == value, f"rank {rank}: {key}: got {snap[key]!r}, Megatron says {value!r}"


# One launch, four layouts (a launch of 8 ranks costs ~0.3 s of CPU before any test runs):
# A  tp=2 pp=2 dp=2; destroyed, then initialised again as tp=4 ep=2;
# B  tp=2 pp=2 cp=2 (dp=1), with ep=2 for the expert groups;
# C  tp=1 pp=4 with two virtual stages per rank (dp=2);
# and last, a virtual pipeline without pipeline parallelism, which must be refused.
@pytest.fixture(scope="module")
def layouts():
    def body(rank):
        from minitron.core import parallel_state as ps

        first = snapshot(rank)
        ps.destroy_model_parallel()
        gone = ps.model_parallel_is_initialized()
        ps.initialize_model_parallel(4, 1, context_parallel_size=1, expert_model_parallel_size=2)
        second = snapshot(rank)
        ps.destroy_model_parallel()
        ps.initialize_model_parallel(2, 2, context_parallel_size=2, expert_model_parallel_size=2)
        cp_ep = snapshot(rank)
        ps.destroy_model_parallel()
        ps.initialize_model_parallel(1, 4, 2)
        virtual = snapshot(rank, vp=2)
        ps.destroy_model_parallel()
        try:
            ps.initialize_model_parallel(2, 1, 2)  # interleaving needs pp > 1
            vp_without_pp = "accepted"
        except Exception as exc:  # noqa: BLE001 - Megatron raises RuntimeError; any clear error will do
            vp_without_pp = type(exc).__name__
        return {"A": (first, gone, second, vp_without_pp), "B": cp_ep, "C": virtual}

    return run_ranks(body, world_size=8, tp=2, pp=2)


@pytest.fixture(scope="module")
def tp2_pp2_then_tp4_ep2(layouts):
    return [r["A"] for r in layouts]


def test_tp2_pp2_getters(tp2_pp2_then_tp4_ep2):
    compare([r[0] for r in tp2_pp2_then_tp4_ep2], 8, tp=2, pp=2)


def test_destroy_then_initialize_again(tp2_pp2_then_tp4_ep2):
    assert [r[1] for r in tp2_pp2_then_tp4_ep2] == [False] * 8
    compare([r[2] for r in tp2_pp2_then_tp4_ep2], 8, tp=4, pp=1, ep=2)


def test_virtual_pipeline_needs_pipeline_parallelism(tp2_pp2_then_tp4_ep2):
    """Megatron: 'pipeline-model-parallel size should be greater than 1 with interleaved schedule'."""
    assert {r[3] for r in tp2_pp2_then_tp4_ep2} != {"accepted"}


def test_tensor_parallel_all_reduce_sums_exactly_its_group(tp2_pp2_then_tp4_ep2):
    # tp groups [0,1] [2,3] [4,5] [6,7]: each rank contributes rank+1.
    assert [r[0]["tp_allreduce"] for r in tp2_pp2_then_tp4_ep2] == [3, 3, 7, 7, 11, 11, 15, 15]
    # After re-initialising as tp=4: [0..3] [4..7].
    assert [r[2]["tp_allreduce"] for r in tp2_pp2_then_tp4_ep2] == [10] * 4 + [26] * 4


# Layout B: tp=2 pp=2 cp=2 (dp=1), with ep=2 for the expert groups. ---------------------
def test_tp2_pp2_cp2_ep2_getters(layouts):
    compare([r["B"] for r in layouts], 8, tp=2, pp=2, cp=2, ep=2)


# Layout C: tp=1 pp=4 with two virtual stages per rank (dp=2). ---------------------------
@pytest.fixture(scope="module")
def pp4_vp2(layouts):
    return [r["C"] for r in layouts]


def test_pp4_vp2_getters(pp4_vp2):
    compare(pp4_vp2, 8, tp=1, pp=4, vp=2)


def test_pp4_vp2_first_and_last_stage_follow_the_virtual_rank(pp4_vp2):
    for rank, snap in enumerate(pp4_vp2):
        assert snap["virtual"] == [tuple(row) for row in expected_virtual(rank, 8, 1, 4, 2)], rank
    # Spelled out for one pipeline [0, 2, 4, 6]: rank 0 is first only on chunk 0, rank 6 last
    # only on chunk 1, and the wrap-around neighbours close the ring.
    assert [s["pp_next"] for s in pp4_vp2[0::2]] == [2, 4, 6, 0]
    assert [s["pp_prev"] for s in pp4_vp2[0::2]] == [6, 0, 2, 4]
    assert [row[1] for row in pp4_vp2[0]["virtual"]] == [True, False]
    assert [row[2] for row in pp4_vp2[6]["virtual"]] == [False, True]


def test_stage_predicates_default_to_ignore_virtual_and_need_vp_stage(pp4_vp2):
    """#12.8: as current Megatron (after core_v0.12), is_pipeline_first_stage /
    is_pipeline_last_stage / is_rank_in_embedding_group default to ignore_virtual=True, i.e.
    answer for the pipeline rank whatever chunk is running; asking about one chunk
    (ignore_virtual=False) needs vp_stage, and without it is refused with a clear error."""
    lay = reference_layout(8, 1, 4)
    for rank, snap in enumerate(pp4_vp2):
        pipe = group_of(lay["pp"], rank)
        in_embd = group_of(lay["embd"], rank) is not None
        assert snap["defaults"] == (rank == pipe[0], rank == pipe[-1], in_embd), rank
        # A rank outside the embedding group is outside it on every chunk: no chunk to ask about.
        assert snap["no_vp_stage"] == [True, True, True if in_embd else "accepted"], rank
    # Rank 0 (first stage) and rank 6 (last stage) hold the word embedding on different chunks.
    assert [row[3] for row in pp4_vp2[0]["virtual"]] == [True, False]
    assert [row[3] for row in pp4_vp2[6]["virtual"]] == [False, True]
    assert pp4_vp2[0]["defaults"] == (True, False, True) and pp4_vp2[6]["defaults"] == (False, True, True)
