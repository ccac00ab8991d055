"""Every group of a layout, computed from rank_generator's generators without any process:
the whole world's groups in the order Megatron creates them (``all_groups``, ``layout``), and one
rank's own groups and coordinates worked out from its digits (``rank_layout``,
``rank_coordinates``), which is what lets a 131,072-rank world be checked a few ranks at a time.

initialize_model_parallel walks ``all_groups`` to make the real groups; `minitron groups`, the
trace checks and the accountant read the same answers here.
"""

from __future__ import annotations

import math
from functools import lru_cache
from itertools import chain

from minitron.core.rank_generator import (DEFAULT_ORDER, GROUP_KINDS, STAGE_RANKS, RankGenerator,
                                          generators)


def all_groups(dense: RankGenerator, expert: RankGenerator):
    """Yield (kind, groups) in the order Megatron creates them: GROUP_KINDS' order, each kind's
    groups in one run, except that each pipeline group is followed at once by the embedding
    groups cut from it. (Runs, not single groups, so that the caller's inner loop stays tight:
    at world 1024 a rank walks ~3400 groups.)"""
    cut_from_stage = [kind for kind in GROUP_KINDS if kind.source == "stage"]
    for kind in GROUP_KINDS:
        if kind.source == "stage":
            continue  # made with their pipeline group, just below
        generator = expert if kind.source in ("expert", "joined") else dense
        groups = generator.get_ranks(kind.token)
        if kind.source == "joined":
            groups = [joined(groups)]
        if kind.key != "pp":
            yield kind, groups
            continue
        for ranks in groups:
            yield kind, (ranks,)
            for stage_kind in cut_from_stage:
                yield stage_kind, (STAGE_RANKS[stage_kind.key](ranks),)


def joined(groups) -> tuple[int, ...]:
    """Groups end to end, as one. (Not ``sum(groups, ())``: that copies the growing tuple once
    per group, quadratic in the world; at 100,000 groups of one it took 18 of `minitron groups`'
    19.5 s.)"""
    return tuple(chain.from_iterable(groups))


def hierarchical_group_ranks(ranks, sizes) -> list[list[list[int]]]:
    """Megatron's create_hierarchical_groups, the rank arithmetic only: for each level of
    ``sizes``, the sub-groups of one context-parallel group ``ranks`` (in cp-rank order).
    Level 0 groups sizes[0] neighbours, level 1 takes one from each of those, and so on: with
    sizes [2, 2], cp ranks [0 1 2 3] give [[0 1] [2 3]] and [[0 2] [1 3]]."""
    levels = []
    for level, size in enumerate(sizes):
        inner = math.prod(sizes[:level])      # the stride: the levels below's sizes
        outer = math.prod(sizes[level + 1:])
        levels.append([[ranks[(o * size + i) * inner + u] for i in range(size)]
                       for o in range(outer) for u in range(inner)])
    return levels


def layout(world_size: int, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
           order: str = DEFAULT_ORDER, expert_tp: int | None = None) -> dict[str, list[list[int]]]:
    """Every group kind -> its list of rank lists, computed without any process."""
    groups: dict[str, list[list[int]]] = {kind.key: [] for kind in GROUP_KINDS}
    for kind, rank_lists in all_groups(*generators(world_size, tp, pp, cp, ep, order, expert_tp)):
        groups[kind.key].extend(list(ranks) for ranks in rank_lists)  # the caller's: fresh lists
    return groups


def rank_layout(rank: int, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
                order: str = DEFAULT_ORDER, expert_tp: int | None = None) -> dict[str, list[int]]:
    """One rank's view of ``layout``: kind -> the group of that kind holding ``rank`` (a kind
    none of whose groups holds it, such as the embedding group of a middle stage, is left out).

    Worked out from the rank's own digits, not by enumerating the world: its group along some
    dimensions is every rank that shares its other digits, members counted fastest digit first,
    as orthogonal_groups counts them. So one rank of a 131,072-rank world costs microseconds,
    and a partial trace is checked without laying out the world. (The joined kind, every
    tp-ep-pp group in one, is the exception: it is the whole world, in the generator's order.)
    """
    dense, expert, world_wide = _world(world_size, tp, pp, cp, ep, order, expert_tp)
    mine: dict[str, list[int]] = {}
    for kind in GROUP_KINDS:
        if kind.source == "stage":
            ranks = STAGE_RANKS[kind.key](mine["pp"])
        elif kind.source == "joined":
            ranks = world_wide[kind.token]
        else:
            ranks = _group_of(rank, expert if kind.source == "expert" else dense, kind.token)
        if rank in ranks:
            mine[kind.key] = list(ranks)
    return mine


@lru_cache(maxsize=16)
def _world(world_size: int, tp: int, pp: int, cp: int, ep: int, order: str, expert_tp: int | None):
    """What every rank of one layout shares: its two generators, validated once, and each
    joined kind's one world-wide group. Kept for the layout's next rank: `estimate --compare`
    asks for all 1024 ranks of each of 8 layouts, and built afresh each time these took half
    of its CPU (the joined group alone is the whole world, once per rank). Never handed out:
    rank_layout copies what it returns."""
    dense, expert = generators(world_size, tp, pp, cp, ep, order, expert_tp)
    world_wide = {kind.token: joined(expert.get_ranks(kind.token)) for kind in GROUP_KINDS if kind.source == "joined"}
    return dense, expert, world_wide


def _group_of(rank: int, generator: RankGenerator, token: str) -> list[int]:
    """The group along ``token`` that holds ``rank``: its fixed digits kept, the others counted."""
    wanted = token.split("-")
    base, members, stride = rank, [0], 1
    for d in generator.order:
        size = generator.size[d]
        digit = (rank // stride) % size
        if d in wanted:  # this digit varies inside the group: later digits in the outer loop
            base -= digit * stride
            members = [m + i * stride for i in range(size) for m in members]
        stride *= size
    return [base + m for m in members]


def rank_coordinates(rank: int, world_size: int, tp: int = 1, pp: int = 1, cp: int = 1,
                     order: str = DEFAULT_ORDER) -> dict[str, int]:
    """This rank's digit along each dense dimension: {'tp': 1, 'cp': 0, 'dp': 0, 'pp': 1, ...}."""
    dense = RankGenerator(tp=tp, ep=1, dp=world_size // (tp * pp * cp), pp=pp, cp=cp, order=order)
    coords, rest = {}, rank
    for d in dense.order:
        coords[d] = rest % dense.size[d]
        rest //= dense.size[d]
    return coords
