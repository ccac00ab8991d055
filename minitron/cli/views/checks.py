"""Cross-rank checks on a trace: did every rank do what Megatron requires?

1. The chain: every rank went pretrain -> initialize_megatron -> _initialize_distributed ->
   init_process_group, and initialize_model_parallel -> new_group.
2. The same groups in the same order: new_group is collective over the whole world, so a rank
   that creates groups in another order pairs its calls with the wrong peers (a mismatch or a
   hang). We compare each rank's sequence of (ranks, description) with the first rank's.
3. The groups are Megatron's: each rank kept the groups the layout arithmetic predicts, and
   every group of the layout was created by its members.

A check the trace cannot decide is reported as not run, never as passed: a script traced with
`launch --trace` may never call pretrain, and under the fake backend each played rank records
only the groups it belongs to, so there is no common sequence to compare.
"""

from __future__ import annotations

from dataclasses import dataclass

from rich.text import Text

from minitron.trace.reader import INIT_MP, backend_of, layout_args, world_size_of
from minitron.trace.schema import NEW_GROUP
from minitron.cli.views.words import plural, rank_ranges
from minitron.core.rank_generator import DESC_TO_KEY, GROUP_KINDS, validate_parallel_sizes
from minitron.core.group_layout import layout, rank_layout

LAYOUT_ALL = tuple(kind.key for kind in GROUP_KINDS)  # every kind a rank may keep, shown or not

CHAIN = (
    "minitron.training.training.pretrain",
    "minitron.training.initialize.initialize_megatron",
    "minitron.training.initialize._initialize_distributed",
    "minitron.comm.comm.init_distributed",
    "torch.distributed.init_process_group",
)


@dataclass
class Check:
    name: str
    ok: bool | None  # None: the trace cannot decide it, so it did not run
    detail: str


def ancestors(records: list[dict], record: dict) -> list[str]:
    """Names from the root down to ``record``'s parent."""
    by_id = {r["id"]: r for r in records}
    names, parent = [], record["parent"]
    while parent is not None and parent in by_id:
        names.append(by_id[parent]["name"])
        parent = by_id[parent]["parent"]
    return names[::-1]


def has_chain(records: list[dict]) -> bool:
    """Does init_process_group sit under the whole chain, and a new_group under initialize_model_parallel?"""
    init = next((r for r in records if r["name"] == CHAIN[-1]), None)
    group = next((r for r in records if r["name"] == NEW_GROUP), None)
    if init is None or group is None:
        return False
    above = ancestors(records, init)
    return all(step in above for step in CHAIN[:-1]) and \
        "minitron.core.parallel_state.initialize_model_parallel" in ancestors(records, group)


def group_calls(records: list[dict]) -> list[tuple]:
    return [(tuple(r["args"]["ranks"]), r["args"]["group_desc"], r["args"].get("backend"))
            for r in records if r["name"] == NEW_GROUP]


def layout_problem(runs: dict[int, list[dict]]) -> tuple[int, dict, str] | None:
    """The first initialize_model_parallel record whose sizes do not tile the trace's world, as
    (rank, record, why): the reader's ``check`` for the views, which lay ranks out by those
    sizes (a run validated them before it traced them; a hand-edited file may not have)."""
    world, seen = world_size_of(runs), set()
    for rank, records in runs.items():
        record = next((r for r in records if r["name"] == INIT_MP), None)
        sizes = layout_args([record]) if record else None
        if sizes is None or tuple(sizes.values()) in seen:
            continue
        seen.add(tuple(sizes.values()))
        try:
            validate_parallel_sizes(world, sizes["tp"], sizes["pp"], sizes["cp"], sizes["ep"], sizes["expert_tp"],
                                    order=sizes["order"])
        except ValueError as exc:
            return rank, record, f"initialize_model_parallel's sizes do not fit the world of {world} ranks ({exc})"
    return None


def check_trace(runs: dict[int, list[dict]], fake: bool | None = None) -> list[Check]:
    """The three checks; ``fake`` defaults to what the trace's init_process_group says."""
    fake = backend_of(runs) == "fake" if fake is None else fake
    return [_chain(runs), _same_sequence(runs, fake), _layout(runs)]


def _chain(runs: dict[int, list[dict]]) -> Check:
    name = "call chain on every rank"
    if not any(r["name"] == CHAIN[0] for records in runs.values() for r in records):
        return Check(name, None, "no rank called pretrain: this trace is of another program")
    missing = [r for r, recs in runs.items() if not has_chain(recs)]
    return Check(name, not missing,
                 f"{plural(len(runs), 'rank')}: pretrain → … → init_process_group; "
                 f"initialize_model_parallel → new_group" if not missing else
                 f"chain incomplete on {plural(len(missing), 'rank')} {rank_ranges(missing)}")


def _same_sequence(runs: dict[int, list[dict]], fake: bool) -> Check:
    name = "same groups, same order"
    if fake:
        return Check(name, None, "fake backend: each played rank records only the groups it belongs to")
    sequences = {rank: group_calls(recs) for rank, recs in runs.items()}
    if not any(sequences.values()):
        return Check(name, None, "no rank called new_group")
    first_rank = min(sequences)
    reference = sequences[first_rank]
    bad = [(rank, _first_difference(reference, seq)) for rank, seq in sequences.items() if seq != reference]
    return Check(name, not bad,
                 f"{plural(len(runs), 'rank')} × {plural(len(reference), 'new_group call')}, identical"
                 if not bad else f"rank {bad[0][0]} differs from rank {first_rank} at call {bad[0][1]}")


def _layout(runs: dict[int, list[dict]]) -> Check:
    name = "groups match the layout"
    sizes = layout_args(next(iter(runs.values())))
    if sizes is None:
        return Check(name, None, "no initialize_model_parallel call on the first rank: no layout to compare")
    world = world_size_of(runs)
    layout_of = (world, sizes["tp"], sizes["pp"], sizes["cp"], sizes["ep"], sizes["order"], sizes["expert_tp"])
    sequences = {rank: group_calls(recs) for rank, recs in runs.items()}
    # Only groups with a member in this directory can have been seen created (a node's ranks
    # may keep their trace files apart from another node's; `trace --ranks` plays a few): each
    # rank present is checked against its own groups, worked out from its digits alone.
    groups_of = _groups_of(layout_of, len(runs))
    wrong = []
    for rank, seq in sequences.items():
        own = groups_of(rank)
        kept = {DESC_TO_KEY.get(desc): ranks for ranks, desc, _ in seq if rank in ranks}
        wrong += [(rank, key, kept.get(key)) for key in LAYOUT_ALL if kept.get(key) != own.get(key)]
    if wrong:
        # A group can be missing only here: a rank that kept each of its own groups created it.
        # So the set of every created group, hashing each rank list of the trace (~0.1 s for
        # 1024 ranks), is built only to say which are missing.
        created = {(DESC_TO_KEY.get(desc), ranks) for seq in sequences.values() for ranks, desc, _ in seq}
        absent = [(key, list(g)) for rank in sequences for key, g in groups_of(rank).items() if (key, g) not in created]
        if absent:
            return Check(name, False, f"missing {absent[:3]}")
        rank, key, kept = wrong[0]
        return Check(name, False, f"rank {rank} joined no {key!r} group" if kept is None else
                     f"rank {rank} kept a wrong {key!r} group {rank_ranges(list(kept))}")
    if len(runs) < world:
        return Check(name, True, f"files of {len(runs)} of the {world} ranks: every group with a member "
                                 f"among them was created; each of them kept its own")
    expected = layout(*layout_of)
    total = sum(len(g) for g in expected.values())
    return Check(name, True, f"all {total} groups of {len(expected)} kinds created; every rank kept its own")


def _groups_of(layout_of: tuple, present: int):
    """rank -> {kind: its group}. A rank's own digits give its groups in time that grows with the
    groups' sizes (one kind is the whole world), laying out the world once takes ~17 steps a
    rank: with more than a sixteenth of the world present, the layout is the cheaper."""
    world = layout_of[0]
    if present * 16 < world:
        return lambda rank: {key: tuple(ranks) for key, ranks in rank_layout(rank, *layout_of).items()}
    owner: dict[int, dict] = {}
    for key, groups in layout(*layout_of).items():
        for group in map(tuple, groups):
            for r in group:
                owner.setdefault(r, {})[key] = group
    return lambda rank: owner.get(rank, {})


def _first_difference(a: list, b: list) -> int:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def check_lines(checks: list[Check]) -> list[Text]:
    """✓ passed, ✗ failed, – not run (with the reason it could not run)."""
    lines = []
    for c in checks:
        if c.ok is None:
            lines.append(Text(f"– {c.name}: not run ({c.detail})", style="dim"))
            continue
        mark, style = ("✓", "green") if c.ok else ("✗", "bold red")
        line = Text(f"{mark} {c.name}: ", style=style)
        line.append(c.detail)
        lines.append(line)
    return lines
