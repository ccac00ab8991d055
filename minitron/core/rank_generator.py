"""Which ranks form which group: the pure arithmetic behind parallel_state.

Megatron keeps RankGenerator inside parallel_state.py. We give it a file of its own because
it is the one piece a reader can run without any process group: `minitron groups` and the
trace checks call `layout()` here, and `initialize_model_parallel` walks the same generators
to make the real groups.

The whole idea in one line: lay the world out as a mixed-radix number whose digits are the
parallel dimensions, fastest-varying first. With the default order ``tp-cp-ep-dp-pp``::

    rank = tp_rank + tp * (cp_rank + cp * (ep_rank + ep * (dp_rank + dp * pp_rank)))

A group "along" some dimensions is the set of ranks that agree on every *other* digit.
So tensor-parallel peers are neighbours (they share the fastest digit's block, which is why
Megatron wants them inside one machine), and pipeline stages are the farthest apart.

Two things are written here once, for everyone: GROUP_KINDS, the table of group kinds that
initialize_model_parallel, `minitron groups` and the trace checks all read; and
validate_parallel_sizes, the rules a layout must obey, which the command line,
validate_args and initialize_model_parallel all call.
"""

from __future__ import annotations

import math

from functools import lru_cache
from itertools import chain
from typing import NamedTuple

DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")
DEFAULT_ORDER = "tp-cp-ep-dp-pp"
# Megatron's --use-tp-pp-dp-mapping switches to this order: pipeline stages become neighbours.
TP_PP_DP_ORDER = "tp-cp-ep-pp-dp"


class GroupKind(NamedTuple):
    """One kind of process group, as initialize_model_parallel makes it."""

    key: str      # our short name: the `groups --json` key and parallel_state's slot
    source: str   # "dense" or "expert": which generator draws it; "stage": cut from each
                  # pipeline group (the embeddings); "joined": every group of `token` in one
    token: str    # what the generator is asked for (expert "tp" is the expert tensor group)
    desc: str     # Megatron's group_desc, which new_group records and traces show
    gloo: bool = False    # Megatron adds a gloo twin (same ranks, desc + "_GLOO")
    shown: bool = True    # printed by `minitron groups`


# Every kind of group, once, in the order Megatron's initialize_model_parallel creates them.
# This one table drives the real groups (parallel_state.py), `minitron groups` and the
# description -> key map the trace checks use.
GROUP_KINDS = (
    # Data parallel with context parallel first: only the first NCCL communicator created may
    # use SHARP in-network reductions, and this is the one whose all-reduce carries gradients.
    GroupKind("dp-cp", "dense", "dp-cp", "DATA_PARALLEL_GROUP_WITH_CP", gloo=True),
    GroupKind("dp", "dense", "dp", "DATA_PARALLEL_GROUP", gloo=True),
    GroupKind("cp", "dense", "cp", "CONTEXT_PARALLEL_GROUP"),
    GroupKind("tp-pp", "dense", "tp-pp", "MODEL_PARALLEL_GROUP"),
    GroupKind("tp", "dense", "tp", "TENSOR_MODEL_PARALLEL_GROUP"),
    GroupKind("pp", "dense", "pp", "PIPELINE_MODEL_PARALLEL_GROUP"),
    # Made right after each pipeline group, from its ranks: the first and last stage share the
    # word embedding (tied input/output weights), the first alone adds position embeddings.
    GroupKind("embd", "stage", "embd", "EMBEDDING_GROUP"),
    GroupKind("pos-embd", "stage", "pos-embd", "POSITION_EMBEDDING_GROUP"),
    GroupKind("tp-dp-cp", "dense", "tp-dp-cp", "TENSOR_AND_DATA_PARALLEL_GROUP_WITH_CP"),
    GroupKind("tp-dp", "dense", "tp-dp", "TENSOR_AND_DATA_PARALLEL_GROUP"),
    GroupKind("tp-cp", "dense", "tp-cp", "TENSOR_AND_CONTEXT_PARALLEL_GROUP"),
    # Expert (MoE) groups: the second generator slices the same world as
    # expert_tp x ep x expert_dp x pp.
    GroupKind("ep", "expert", "ep", "EXPERT_MODEL_PARALLEL_GROUP"),
    GroupKind("expt-tp", "expert", "tp", "EXPERT_TENSOR_PARALLEL_GROUP"),
    GroupKind("tp-ep", "expert", "tp-ep", "EXPERT_TENSOR_AND_MODEL_PARALLEL_GROUP"),
    GroupKind("tp-ep-pp", "expert", "tp-ep-pp", "EXPERT_TENSOR_MODEL_PIPELINE_PARALLEL_GROUP", shown=False),
    GroupKind("expt-dp", "expert", "dp", "EXPERT_DATA_PARALLEL_GROUP", gloo=True),
    # With one distributed-optimizer instance, the instance is every tp-ep-pp group joined.
    GroupKind("intra-dist-opt", "joined", "tp-ep-pp", "INTRA_DISTRIBUTED_OPTIMIZER_INSTANCE_GROUP",
              shown=False),
)

# The groups `minitron groups --json` prints, in creation order.
LAYOUT_KEYS = tuple(kind.key for kind in GROUP_KINDS if kind.shown)
# new_group's group_desc (Megatron's names) -> our short key, for reading traces.
DESC_TO_KEY = {kind.desc: kind.key for kind in GROUP_KINDS}
# --hierarchical-context-parallel-sizes' sub-groups of each cp group (a2a+p2p), outside the
# layout's kinds. Megatron files them under the cp group's own description; minitron names them
# apart, so that a trace tells the sub-groups from the group (and a rank's cp group is still
# the one it kept). Traces and estimates key their traffic by this name.
HIERARCHICAL_CP_DESC = "HIERARCHICAL_CONTEXT_PARALLEL_GROUP"


def parse_order(order: str) -> tuple[str, ...]:
    """'tp-cp-ep-dp-pp' -> ('tp', 'cp', 'ep', 'dp', 'pp'), or ValueError saying what is wrong."""
    tokens = tuple(t.strip().lower() for t in order.split("-"))
    unknown = [t for t in tokens if t not in DIMENSIONS]
    if unknown or len(set(tokens)) != len(tokens):
        raise ValueError(
            f"order {order!r} must name each of {', '.join(DIMENSIONS)} at most once, "
            f"joined by '-' (e.g. {DEFAULT_ORDER})"
        )
    # Dimensions left out have size 1 in Megatron's generator; put them last so they add no digit.
    return tokens + tuple(d for d in DIMENSIONS if d not in tokens)


@lru_cache(maxsize=None)
def orthogonal_groups(sizes: tuple[int, ...], mask: tuple[bool, ...]) -> tuple[tuple[int, ...], ...]:
    """All groups that vary the masked digits and fix the others.

    ``sizes`` are the digit radices, fastest first. Inside a group the masked digits count up
    fastest-first; groups are numbered by the unmasked digits, also fastest-first. That is
    exactly the enumeration Megatron's generate_masked_orthogonal_rank_groups produces, which
    matters: every rank must create the same groups *in the same order*.

    Cached because the answer depends on the sizes alone, and the fake backend asks it once
    per simulated rank (1024 times for a 1024-rank world). The cache holds tuples, so no
    caller can change what the next one gets.
    """
    strides, s = [], 1
    for size in sizes:
        strides.append(s)
        s *= size

    def offsets(dims):
        out = [0]
        for size, stride in dims:  # later dims vary slower: they go in the outer loop
            out = [o + i * stride for i in range(size) for o in out]
        return out

    inside = [(n, st) for n, st, m in zip(sizes, strides, mask) if m]
    outside = [(n, st) for n, st, m in zip(sizes, strides, mask) if not m]
    members = offsets(inside)   # the same for every group: worked out once, not per group
    return tuple(tuple(base + off for off in members) for base in offsets(outside))


class RankGenerator:
    """Groups for one set of sizes, named by tokens such as 'tp', 'dp-cp' or 'tp-ep'.

    It takes sizes as given: validate_parallel_sizes, below, is where they are checked.
    """

    def __init__(self, tp: int, ep: int, dp: int, pp: int, cp: int, order: str, rank_offset: int = 0):
        self.size = {"tp": tp, "cp": cp, "ep": ep, "dp": dp, "pp": pp}
        self.order = parse_order(order)
        self.rank_offset = rank_offset
        self.world_size = tp * cp * ep * dp * pp

    def get_ranks(self, token: str) -> list[tuple[int, ...]]:
        """Every group along ``token``, each a tuple of ranks. (Megatron returns lists; tuples let
        the cached groups be handed out without copying them and without any caller being able
        to change them: initialize_model_parallel walks ~3400 of them per rank at world 1024.)"""
        wanted = token.split("-")
        mask = tuple(d in wanted for d in self.order)
        sizes = tuple(self.size[d] for d in self.order)
        groups = orthogonal_groups(sizes, mask)
        if self.rank_offset:
            return [tuple(r + self.rank_offset for r in g) for g in groups]
        return list(groups)


def default_embedding_ranks(pp_ranks) -> tuple[int, ...]:
    """The word embedding lives on the first stage (input) and the last (tied output layer)."""
    return (pp_ranks[0],) if len(pp_ranks) == 1 else (pp_ranks[0], pp_ranks[-1])


def default_position_embedding_ranks(pp_ranks) -> tuple[int, ...]:
    """Position embeddings are only added at the input, so only the first stage holds them."""
    return (pp_ranks[0],)


STAGE_RANKS = {"embd": default_embedding_ranks, "pos-embd": default_position_embedding_ranks}


def validate_parallel_sizes(world_size: int, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
                            expert_tp: int | None = None, vp: int | None = None,
                            order: str = DEFAULT_ORDER) -> dict[str, int]:
    """Check that the parallel sizes tile the world as Megatron requires; return the derived
    sizes {'dp': ..., 'expert_tp': ..., 'expert_dp': ...}.

    The one place these rules live: `minitron groups`, `minitron trace`, validate_args and
    initialize_model_parallel all ask it, before any process or group exists. Raises
    ValueError with one line that says what is wrong and what would fix it.
    """
    expert_tp = tp if expert_tp is None else expert_tp
    if world_size < 1:
        raise ValueError(f"world size must be at least 1, got {world_size}")
    for name, size in (("tensor-model-parallel", tp), ("pipeline-model-parallel", pp),
                       ("context-parallel", cp), ("expert-model-parallel", ep),
                       ("expert-tensor-parallel", expert_tp)):
        if size < 1:
            raise ValueError(f"{name} size must be at least 1, got {size}")
    model = tp * pp * cp
    if world_size % model:
        raise ValueError(
            f"world size {world_size} is not divisible by tensor x pipeline x context parallel "
            f"= {tp} x {pp} x {cp} = {model}; choose sizes whose product divides {world_size}")
    expert_model = expert_tp * ep * pp
    if world_size % expert_model:
        raise ValueError(
            f"world size {world_size} is not divisible by expert tensor x expert model x pipeline "
            f"parallel = {expert_tp} x {ep} x {pp} = {expert_model}; choose sizes whose product "
            f"divides {world_size}")
    if vp is not None and vp < 1:
        raise ValueError(f"virtual-pipeline-model-parallel size must be at least 1, got {vp}")
    if vp is not None and pp < 2:
        raise ValueError(f"a virtual pipeline (interleaved schedule) needs pipeline-model-parallel "
                         f"size > 1, got {pp}")
    sizes = {"dp": world_size // model, "expert_tp": expert_tp, "expert_dp": world_size // expert_model}
    _validate_order(order, tp, pp, cp, ep, sizes)
    return sizes


def _validate_order(order: str, tp: int, pp: int, cp: int, ep: int, sizes: dict[str, int]) -> None:
    """Megatron's rules for the order string, checked on both generators' sizes."""
    tokens = parse_order(order)  # raises on unknown or repeated tokens
    named = order.lower().split("-")
    dense = {"tp": tp, "cp": cp, "ep": 1, "dp": sizes["dp"], "pp": pp}
    expert = {"tp": sizes["expert_tp"], "cp": 1, "ep": ep, "dp": sizes["expert_dp"], "pp": pp}
    missing = [d for d in DIMENSIONS if d not in named and max(dense[d], expert[d]) > 1]
    if missing:  # left out, a dimension would silently become the slowest digit
        raise ValueError(f"order {order!r} leaves out {', '.join(missing)}, whose size is not 1")
    if tokens[-1] != "pp" and pp > 1 and sizes["dp"] != sizes["expert_dp"]:
        raise ValueError(
            f"with order {order} (pp not last) the dense and expert data-parallel sizes must "
            f"match, but they are {sizes['dp']} and {sizes['expert_dp']}")
    pp_mask = tuple(d == "pp" for d in tokens)
    if orthogonal_groups(tuple(dense[d] for d in tokens), pp_mask) != \
            orthogonal_groups(tuple(expert[d] for d in tokens), pp_mask):
        raise ValueError(f"with order {order} the dense and expert layouts disagree on the pipeline groups")


def generators(world_size: int, tp: int = 1, pp: int = 1, cp: int = 1, ep: int = 1,
               order: str = DEFAULT_ORDER, expert_tp: int | None = None):
    """The dense ("decoder") and expert generators initialize_model_parallel uses.

    The expert generator re-slices the same world: the dense tp x cp block becomes
    expert_tp x ep, and whatever is left over is the expert data-parallel size.
    Raises ValueError when the sizes do not tile the world.
    """
    sizes = validate_parallel_sizes(world_size, tp, pp, cp, ep, expert_tp, order=order)
    dense = RankGenerator(tp=tp, ep=1, dp=sizes["dp"], pp=pp, cp=cp, order=order)
    expert = RankGenerator(tp=sizes["expert_tp"], ep=ep, dp=sizes["expert_dp"], pp=pp, cp=1, order=order)
    return dense, expert


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
    dense, expert = generators(world_size, tp, pp, cp, ep, order, expert_tp)
    mine: dict[str, list[int]] = {}
    for kind in GROUP_KINDS:
        if kind.source == "stage":
            ranks = STAGE_RANKS[kind.key](mine["pp"])
        elif kind.source == "joined":
            ranks = joined(expert.get_ranks(kind.token))
        else:
            ranks = _group_of(rank, expert if kind.source == "expert" else dense, kind.token)
        if rank in ranks:
            mine[kind.key] = list(ranks)
    return mine


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
