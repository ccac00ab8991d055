"""minitron's rank layout against Megatron-LM's behaviour.

Three kinds of evidence, none of them minitron's own code:
* tests/megatron_reference.py, an independent recomputation of Megatron's rank generators;
* the worked examples printed in Megatron's docstrings, copied here as literal numbers;
* properties any correct layout has (each rank in one group per kind, orthogonal groups
  meeting in exactly one rank, Megatron's rank equation).
"""

from __future__ import annotations

import itertools

import pytest

from megatron_reference import (
    DEFAULT_ORDER, EXTRA_KINDS, KINDS, TP_PP_DP_ORDER, Refused, coordinates, reference_layout,
    sizes_of,
)
from minitron.core.group_layout import layout, rank_coordinates

D, P = DEFAULT_ORDER, TP_PP_DP_ORDER

# (world, tp, pp, cp, ep, order): every world size, each dimension alone and mixed, both orders.
LAYOUTS = [
    (1, 1, 1, 1, 1, D), (1, 1, 1, 1, 1, P),
    (2, 2, 1, 1, 1, D), (2, 1, 2, 1, 1, D), (2, 1, 1, 2, 1, D), (2, 1, 1, 1, 2, P),
    (4, 2, 2, 1, 1, D), (4, 2, 2, 1, 1, P), (4, 1, 1, 2, 2, D), (4, 1, 2, 1, 2, D),
    (4, 1, 1, 4, 1, P), (4, 1, 2, 2, 2, P),
    (8, 2, 2, 1, 1, D), (8, 2, 2, 1, 1, P), (8, 2, 2, 2, 1, D), (8, 4, 2, 1, 1, D),
    (8, 1, 4, 1, 2, D), (8, 2, 1, 2, 4, D), (8, 2, 2, 2, 2, P), (8, 1, 1, 2, 8, P),
    (8, 1, 8, 1, 1, P), (8, 8, 1, 1, 1, D),
    (16, 2, 4, 1, 1, D), (16, 2, 4, 1, 1, P), (16, 2, 2, 2, 2, D), (16, 4, 2, 2, 1, D),
    (16, 1, 4, 2, 4, D), (16, 2, 2, 4, 4, P), (16, 4, 1, 1, 4, P),
    (32, 4, 4, 1, 2, D), (32, 2, 4, 2, 1, D), (32, 2, 2, 2, 8, D), (32, 4, 2, 2, 2, P),
    (32, 1, 8, 4, 4, P), (32, 8, 2, 1, 1, P),
    (64, 8, 4, 1, 2, D), (64, 4, 2, 2, 8, D), (64, 2, 8, 2, 2, D), (64, 8, 2, 4, 4, P),
    (64, 4, 8, 2, 2, P), (64, 2, 2, 1, 1, P),
]


def ident(case):
    world, tp, pp, cp, ep, order = case
    return f"w{world}-tp{tp}-pp{pp}-cp{cp}-ep{ep}-{'pp_last' if order == D else 'dp_last'}"


@pytest.fixture(params=LAYOUTS, ids=[ident(c) for c in LAYOUTS])
def case(request):
    world, tp, pp, cp, ep, order = request.param
    ref = reference_layout(world, tp, pp, cp, ep, order)  # also proves the case is valid
    got = layout(world, tp=tp, pp=pp, cp=cp, ep=ep, order=order)
    return request.param, ref, got


def test_every_kind_matches_megatron(case):
    _, ref, got = case
    assert set(KINDS) <= set(got)
    for kind in KINDS + EXTRA_KINDS:
        assert got[kind] == ref[kind], kind


def test_each_rank_in_exactly_one_group_of_each_kind(case):
    (world, *_), _, got = case
    for kind in KINDS + EXTRA_KINDS:
        if kind in ("embd", "pos-embd"):
            continue  # only the pipeline ends hold embeddings
        flat = sorted(r for g in got[kind] for r in g)
        assert flat == list(range(world)), kind


def test_group_sizes(case):
    (world, tp, pp, cp, ep, _), _, got = case
    dp, edp = world // (tp * pp * cp), world // (tp * ep * pp)
    want = {"tp": tp, "pp": pp, "dp": dp, "cp": cp, "dp-cp": dp * cp, "tp-pp": tp * pp,
            "tp-cp": tp * cp, "tp-dp": tp * dp, "tp-dp-cp": tp * dp * cp, "ep": ep,
            "expt-tp": tp, "expt-dp": edp, "tp-ep": tp * ep}
    for kind, size in want.items():
        assert {len(g) for g in got[kind]} == {size}, kind
        assert len(got[kind]) == world // size, kind


@pytest.mark.parametrize("a, b, both", [
    ("tp", "dp", "tp-dp"), ("tp", "pp", "tp-pp"), ("tp", "cp", "tp-cp"), ("dp", "cp", "dp-cp"),
    ("tp", "dp-cp", "tp-dp-cp"), ("tp-dp", "cp", "tp-dp-cp"), ("tp-cp", "dp", "tp-dp-cp"),
    ("expt-tp", "ep", "tp-ep"),
])
def test_orthogonal_groups_meet_in_one_rank(case, a, b, both):
    """Inside one `both` group (e.g. one pp stage's tp x dp block), every `a` group crosses
    every `b` group in exactly one rank, and the `a` groups tile the block."""
    _, _, got = case
    for block in got[both]:
        block = set(block)
        inner_a = [set(g) for g in got[a] if set(g) <= block]
        inner_b = [set(g) for g in got[b] if set(g) <= block]
        assert set().union(*inner_a) == block and set().union(*inner_b) == block
        for ga, gb in itertools.product(inner_a, inner_b):
            assert len(ga & gb) == 1


def test_embedding_groups_are_pipeline_ends(case):
    _, _, got = case
    assert len(got["embd"]) == len(got["pp"]) == len(got["pos-embd"])
    for pipe, embd, pos in zip(got["pp"], got["embd"], got["pos-embd"]):
        assert embd == ([pipe[0]] if len(pipe) == 1 else [pipe[0], pipe[-1]])
        assert pos == [pipe[0]]


def test_megatron_rank_equation(case):
    """Megatron's equation: rank = tp_rank + tp*(cp_rank + cp*(dp_rank + dp*pp_rank)) for the
    default order (dp and pp swap places in tp-cp-ep-pp-dp); the index of a rank inside its
    tp/cp/dp/pp group is that digit."""
    (world, tp, pp, cp, ep, order), _, got = case
    dp = world // (tp * pp * cp)
    for rank in range(world):
        t, c = rank % tp, (rank // tp) % cp
        if order == D:
            d, p = (rank // (tp * cp)) % dp, rank // (tp * cp * dp)
        else:
            p, d = (rank // (tp * cp)) % pp, rank // (tp * cp * pp)
        digit = {"tp": t, "cp": c, "dp": d, "pp": p}
        for kind, index in digit.items():
            group = next(g for g in got[kind] if rank in g)
            assert group.index(rank) == index, (kind, rank)
        coords = rank_coordinates(rank, world, tp=tp, pp=pp, cp=cp, order=order)
        assert {k: coords[k] for k in digit} == digit
        assert {k: coordinates(rank, world, tp, pp, cp, order)[k] for k in digit} == digit


def test_tp_groups_are_neighbours_in_default_order(case):
    (world, tp, _, _, _, order), _, got = case
    if order != D:
        pytest.skip("contiguity is a property of the default order")
    assert got["tp"] == [list(range(s, s + tp)) for s in range(0, world, tp)]


def test_pp_stages_are_neighbouring_blocks_in_tp_pp_dp_order(case):
    (world, tp, pp, cp, _, order), _, got = case
    if order != P:
        pytest.skip("this is the property --use-tp-pp-dp-mapping buys")
    step = tp * cp
    for pipe in got["pp"]:
        assert [r - pipe[0] for r in pipe] == [i * step for i in range(pp)]
        assert pipe[-1] - pipe[0] < tp * cp * pp  # one tp*cp*pp block


# Megatron's docstrings, literally. ------------------------------------------------------
def test_megatron_docstring_16_gpus_tp2_pp4():
    got = layout(16, tp=2, pp=4)
    assert got["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert got["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert got["pp"] == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]
    assert got["embd"] == [[0, 12], [1, 13], [2, 14], [3, 15]]


def test_megatron_docstring_tp2_dp3_pp4():
    """generate_masked_orthogonal_rank_groups' example: sizes [2, 3, 4] in order tp-dp-pp."""
    got = layout(24, tp=2, pp=4, order="tp-dp-pp")
    assert got["dp"] == [[0, 2, 4], [1, 3, 5], [6, 8, 10], [7, 9, 11],
                         [12, 14, 16], [13, 15, 17], [18, 20, 22], [19, 21, 23]]


def test_megatron_docstring_context_parallel_8_gpus_tp4_cp2():
    got = layout(8, tp=4, cp=2)
    assert got["cp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert got["tp"] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_megatron_docstring_tp_pp_dp_order_8_gpus():
    """The algorithm note: 8 GPUs, order tp-pp-dp, sizes 2-2-2 -> dp [[0,4],[1,5],[2,6],[3,7]]."""
    assert layout(8, tp=2, pp=2, order="tp-pp-dp")["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]


def test_expert_tensor_parallel_size_differs_from_tp():
    """expert_tp re-slices the expert generator only; dense groups do not move."""
    for world, tp, pp, ep, etp in [(8, 2, 1, 4, 1), (16, 2, 2, 4, 1), (16, 1, 2, 2, 4), (8, 4, 2, 4, 1)]:
        ref = reference_layout(world, tp, pp, 1, ep, D, expert_tp=etp)
        got = layout(world, tp=tp, pp=pp, ep=ep, expert_tp=etp)
        for kind in KINDS + EXTRA_KINDS:
            assert got[kind] == ref[kind], (world, tp, pp, ep, etp, kind)
        assert {len(g) for g in got["expt-dp"]} == {world // (etp * ep * pp)}


def test_sweep_agrees_with_megatron_on_every_layout_and_refusal():
    """Every combination up to world 64 (powers of two and a few others): the same groups
    where Megatron accepts the layout, a ValueError where it refuses it."""
    checked = refused = 0
    for world in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 64):
        for tp, pp, cp, ep, order in itertools.product(
                (1, 2, 3, 4, 8), (1, 2, 4, 8), (1, 2, 4), (1, 2, 4, 8), (D, P)):
            try:
                ref = reference_layout(world, tp, pp, cp, ep, order)
            except Refused:
                with pytest.raises(ValueError):
                    layout(world, tp=tp, pp=pp, cp=cp, ep=ep, order=order)
                refused += 1
                continue
            got = layout(world, tp=tp, pp=pp, cp=cp, ep=ep, order=order)
            assert all(got[k] == ref[k] for k in KINDS + EXTRA_KINDS), (world, tp, pp, cp, ep, order)
            checked += 1
    assert checked > 500 and refused > 1000


# Bad sizes: a ValueError whose message names the problem. --------------------------------
@pytest.mark.parametrize("kwargs, words", [
    (dict(world_size=16, tp=3), ["16", "3", "divisible"]),
    (dict(world_size=12, tp=2, pp=4), ["12", "divisible"]),
    (dict(world_size=8, tp=2, cp=3), ["8", "divisible"]),
    (dict(world_size=8, tp=2, pp=2, ep=4), ["8", "divisible"]),  # expert_tp*ep*pp = 16
    (dict(world_size=16, tp=2, pp=2, ep=3), ["16", "divisible"]),
    (dict(world_size=8, tp=2, order="tp-cp-ep-xx-pp"), ["xx"]),
    (dict(world_size=8, tp=2, pp=2, cp=2, order=P), ["pp"]),    # dp 1 vs expert dp 2
])
def test_bad_sizes_raise_value_error(kwargs, words):
    with pytest.raises(Refused):
        sizes_of(kwargs["world_size"], kwargs.get("tp", 1), kwargs.get("pp", 1), kwargs.get("cp", 1),
                 kwargs.get("ep", 1), kwargs.get("order", D))  # Megatron refuses it too
    with pytest.raises(ValueError) as info:
        layout(**kwargs)
    message = str(info.value)
    assert "\n" not in message.strip()
    for word in words:
        assert word in message


@pytest.mark.parametrize("kwargs", [
    dict(world_size=8, tp=0), dict(world_size=8, pp=0), dict(world_size=8, cp=0),
    dict(world_size=8, ep=0), dict(world_size=0), dict(world_size=-4, tp=2), dict(world_size=8, tp=-2),
])
def test_non_positive_sizes_raise_value_error(kwargs):
    with pytest.raises(ValueError):
        layout(**kwargs)


def test_order_must_name_every_dimension_larger_than_one():
    """Megatron's RankGenerator raises when a size > 1 is missing from the order; silently
    appending it would make tp the slowest digit and give [0, 4] tensor groups."""
    with pytest.raises(Refused):
        sizes_of(8, 2, 1, 1, 1, "cp-ep-dp-pp")
    with pytest.raises(ValueError, match="tp"):
        layout(8, tp=2, order="cp-ep-dp-pp")
    # Leaving out a dimension of size 1 is fine, in both.
    assert layout(8, tp=2, pp=2, order="tp-dp-pp")["tp"] == reference_layout(8, 2, 2, order="tp-dp-pp")["tp"]


def test_layout_returns_fresh_lists():
    """layout() is a pure function: what one caller does with its answer (sort, append, pop)
    must not change the next caller's. Group lists shared with a cache would."""
    first = layout(8, tp=2, pp=2)
    first["tp"][0].append(99)
    first["dp"].clear()
    again = layout(8, tp=2, pp=2)
    assert again["tp"][0] == [0, 1]
    assert again["dp"] == reference_layout(8, 2, 2)["dp"]


# One table of groups, one home for the size rules. ---------------------------------------
def test_the_group_table_walks_megatrons_new_group_sequence():
    """all_groups (what initialize_model_parallel creates, gloo twins aside) is, call for call,
    Megatron's creation sequence as tests/megatron_reference.py recomputes it."""
    from megatron_reference import creation_sequence
    from minitron.core.rank_generator import generators
    from minitron.core.group_layout import all_groups

    for world, tp, pp, cp, ep, order in LAYOUTS:
        walked = []
        for kind, groups in all_groups(*generators(world, tp, pp, cp, ep, order)):
            for ranks in groups:
                walked.append((kind.desc, list(ranks)))
                if kind.gloo:
                    walked.append((kind.desc + "_GLOO", list(ranks)))
        assert walked == creation_sequence(world, tp, pp, cp, ep, order), (world, tp, pp, cp, ep, order)


def test_layout_keys_and_descriptions_come_from_the_table():
    from megatron_reference import DESC
    from minitron.core.rank_generator import DESC_TO_KEY, GROUP_KINDS, LAYOUT_KEYS

    assert set(LAYOUT_KEYS) == set(KINDS)  # what `minitron groups --json` prints
    assert DESC_TO_KEY == {desc: key for key, desc in DESC.items()}
    assert [k.key for k in GROUP_KINDS if k.gloo] == ["dp-cp", "dp", "expt-dp"]


def test_validate_parallel_sizes_derives_the_sizes_and_is_the_one_check():
    from minitron.core.rank_generator import validate_parallel_sizes

    assert validate_parallel_sizes(16, tp=2, pp=4) == {"dp": 2, "expert_tp": 2, "expert_dp": 2}
    assert validate_parallel_sizes(16, tp=2, pp=2, ep=4, expert_tp=1) == {"dp": 4, "expert_tp": 1, "expert_dp": 2}
    assert validate_parallel_sizes(8, pp=2, vp=3)["dp"] == 4
    for kwargs, words in [
        (dict(world_size=8, vp=2), ["virtual", "pipeline-model-parallel", "1"]),  # vp needs pp > 1
        (dict(world_size=8, pp=2, vp=0), ["virtual", "0"]),
        (dict(world_size=8, tp=2, expert_tp=0), ["expert-tensor-parallel", "0"]),
        (dict(world_size=12, tp=2, pp=4), ["12", "divisible", "2 x 4 x 1 = 8"]),
    ]:
        with pytest.raises(ValueError) as info:
            validate_parallel_sizes(**kwargs)
        message = str(info.value)
        assert "\n" not in message and all(w in message for w in words), message
