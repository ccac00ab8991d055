"""The groups every rank joined, one row per rank: the executed new_group calls, not the
arithmetic (that is `minitron groups`), so a rank that kept a wrong group shows it here."""

from __future__ import annotations

from rich.table import Table

from minitron.cli.views.checks import group_calls
from minitron.trace.reader import layout_args, world_size_of
from minitron.cli.views.words import rank_ranges
from minitron.core.rank_generator import DESC_TO_KEY
from minitron.core.group_layout import rank_coordinates

TABLE_KEYS = ("tp", "cp", "dp", "pp", "embd", "ep")
WRAP_ABOVE = 64  # worlds larger than this have groups too long for a line (`trace --ranks`)


def group_table(runs: dict[int, list[dict]]) -> Table:
    """One row per rank: its coordinates (when the trace has the layout) and the ranks of each
    group it is in. No pid column: a pid changes from run to run and says nothing about the
    layout (the closing line counts the processes, which is what tells gloo's one process per
    rank from the fake backend's few copies playing many)."""
    world = world_size_of(runs)
    sizes = layout_args(next(iter(runs.values())))
    if sizes:
        keys = [k for k in TABLE_KEYS if k in ("tp", "pp", "dp", "embd") or sizes.get(k, 1) > 1]
    else:  # a program of its own: a column per group description it used, in first-seen order
        keys = list(dict.fromkeys(DESC_TO_KEY.get(desc, desc) for records in runs.values()
                                  for _, desc, _ in group_calls(records)))
    table = Table(title="groups each rank joined (its executed new_group calls)", title_style="bold")
    dims = [d for d in ("tp", "cp", "dp", "pp") if d != "cp" or sizes["cp"] > 1] if sizes else []
    table.add_column("rank", justify="right", no_wrap=True)
    if dims:
        table.add_column(" ".join(dims), justify="center", no_wrap=True)  # the rank's coordinates
    for key in keys:
        # A large world's groups fold onto more lines: left on one, rich would narrow every
        # column alike when the table is too wide, down to the rank column's vanishing.
        wrap = world > WRAP_ABOVE
        table.add_column(f"{key} group", no_wrap=not wrap, overflow="fold" if wrap else "ellipsis")
    for rank, records in runs.items():
        joined = {DESC_TO_KEY.get(desc, desc): list(ranks) for ranks, desc, _ in group_calls(records) if rank in ranks}
        coords = []
        if dims:
            c = rank_coordinates(rank, world, sizes["tp"], sizes["pp"], sizes["cp"], sizes["order"])
            coords = ["  ".join(str(c[d]) for d in dims)]
        table.add_row(str(rank), *coords, *[short_ranks(joined.get(key, "-")) for key in keys])
    return table


def short_ranks(ranks, most: int = 24) -> str:
    """A group as rank_ranges writes it, or, when that is longer than ``most`` characters (a data-
    parallel group of a 131,072-rank world holds 512 ranks), its first two members, its last and
    its size: ``[0,16,…,8176] (512)`` reads as a stride of 16."""
    text = rank_ranges(ranks)
    if len(text) <= most or not isinstance(ranks, list):
        return text
    return f"[{ranks[0]},{ranks[1]},…,{ranks[-1]}] ({len(ranks)})"
