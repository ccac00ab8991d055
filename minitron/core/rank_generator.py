"""Which ranks form which group: the pure arithmetic behind parallel_state.

Megatron keeps RankGenerator inside parallel_state.py. We give it a file of its own because
it is the one piece a reader can run without any process group: `minitron groups` and the
trace checks lay the world out from it (group_layout.py), and `initialize_model_parallel` walks
the same generators to make the real groups.

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

from functools import lru_cache
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
