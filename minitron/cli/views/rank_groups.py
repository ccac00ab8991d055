"""`minitron groups --rank N`: one rank's view of the layout, at any world size.

What a rank knows after initialize_model_parallel is one group of each kind (parallel_state_getters'
_GROUP), not the layout: this view prints just that, worked out from the rank's own digits
(group_layout.rank_layout), so rank 12,345 of 131,072 costs what rank 5 of 16 does. Beside
each group: the rank's place in it (its tensor-parallel rank, its stage, ...) and how many
nodes of 8 GPUs the group spans, which is what decides whether its traffic stays on NVLink.
"""

from __future__ import annotations

from rich.console import Group
from rich.table import Table
from rich.text import Text

from minitron.cli.views.group_table import short_ranks
from minitron.cli.views.layout import TITLES
from minitron.cli.views.svg_nodes import GPUS_PER_NODE
from minitron.core.rank_generator import GROUP_KINDS, LAYOUT_KEYS
from minitron.core.group_layout import rank_coordinates

DESCS = {kind.key: kind.desc for kind in GROUP_KINDS}


def layout_line(world: int, tp: int, pp: int, cp: int, ep: int, order: str) -> str:
    dp = world // (tp * pp * cp)
    sizes = f"tp {tp} × " + (f"cp {cp} × " if cp > 1 else "") + f"dp {dp} × pp {pp}" + (f", ep {ep}" if ep > 1 else "")
    return f"{world:,} ranks = {sizes}, order {order}"


def rank_json(world: int, rank: int, own: dict[str, list[int]], tp: int, pp: int, cp: int, order: str) -> dict:
    return {"world": world, "rank": rank, "coordinates": rank_coordinates(rank, world, tp, pp, cp, order),
            "node": rank // GPUS_PER_NODE, "gpus_per_node": GPUS_PER_NODE,
            "groups": {key: own[key] for key in LAYOUT_KEYS if key in own}}


def rank_view(world: int, rank: int, own: dict[str, list[int]], tp: int, pp: int, cp: int, ep: int, order: str):
    """A renderable: the layout, the rank's coordinates and node, then a row per kind of group."""
    coords = rank_coordinates(rank, world, tp, pp, cp, order)
    node = rank // GPUS_PER_NODE
    head = Text(f"rank {rank:,} of {layout_line(world, tp, pp, cp, ep, order)}", style="bold")
    where = Text(", ".join(f"{d} {coords[d]}" for d in ("tp", "cp", "dp", "pp") if d != "cp" or cp > 1)
                 + f"; node {node:,} (GPU {rank % GPUS_PER_NODE} of its {GPUS_PER_NODE})", style="dim")
    table = Table(title=f"the groups rank {rank:,} keeps, one of each kind", title_style="bold")
    for name, justify in (("kind", "left"), ("size", "right"), ("its place", "right"), ("group", "left"),
                          ("nodes", "right")):
        table.add_column(name, justify=justify, no_wrap=name != "group", overflow="fold")
    for key in LAYOUT_KEYS:
        if key not in own:
            table.add_row(key, "-", "-", Text(f"in no {DESCS[key]}", style="dim"), "-")
            continue
        group = own[key]
        nodes = len({r // GPUS_PER_NODE for r in group})
        table.add_row(key, f"{len(group):,}", str(group.index(rank)), short_ranks(group, 40), f"{nodes:,}")
    stages = own["pp"]
    stage = stages.index(rank)
    neighbours = Text(f"pipeline: stage {stage} of {len(stages)}", style="dim")
    if len(stages) > 1:
        neighbours.append(f"; prev rank {stages[stage - 1]:,}, next rank {stages[(stage + 1) % len(stages)]:,} "
                          f"(get_pipeline_model_parallel_prev_rank / _next_rank, which wrap around)", style="dim")
    keys = ", ".join(f"{k}: {TITLES[k]}" for k in ("tp", "dp", "pp", "cp", "ep") if k in own)
    return Group(head, where, table, neighbours, Text(keys, style="dim"))
