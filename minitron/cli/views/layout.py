"""`minitron groups` without --json: the layout as coloured grids of ranks.

One panel per kind of group. Ranks sit in rows by pipeline stage (in the default order a
stage is a contiguous block of ranks, i.e. often one machine), and every group of the kind
has its own colour, so "tensor-parallel peers are neighbours, pipeline peers are far apart"
is visible at a glance — the picture behind Megatron's 16-GPU docstring example.
"""

from __future__ import annotations

from rich.columns import Columns
from rich.console import Group
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from minitron.core.group_layout import rank_coordinates

PALETTE = ("red", "green", "blue", "magenta", "cyan", "yellow", "bright_red", "bright_green",
           "bright_blue", "bright_magenta", "bright_cyan", "orange3", "purple", "turquoise2",
           "deep_pink3", "chartreuse3")
TITLES = {"tp": "tensor parallel", "pp": "pipeline parallel", "dp": "data parallel",
          "cp": "context parallel", "ep": "expert parallel", "embd": "embedding (first+last stage)",
          "tp-pp": "model parallel (tp x pp)"}
MAX_RANKS_DRAWN = 64


def group_letter(index: int) -> str:
    """A, B, ..., Z, AA, AB, ...: names a group in plain text, where colour is lost."""
    name = ""
    index += 1
    while index:
        index, rem = divmod(index - 1, 26)
        name = chr(65 + rem) + name
    return name


def _grid(world: int, groups: list[list[int]], stage_of: dict[int, int]) -> Table:
    """Each cell is 'rank+letter', the letter naming its group (ranks in no group: '·')."""
    member = {r: i for i, g in enumerate(groups) for r in g}
    grid = Table.grid(padding=(0, 1))
    for stage in sorted(set(stage_of.values())):
        cells = [Text(f"{r:>3}{group_letter(member[r]) if r in member else '·':<2}",
                      style=f"bold {PALETTE[member[r] % len(PALETTE)]}" if r in member else "dim")
                 for r in range(world) if stage_of[r] == stage]
        grid.add_row(Text(f"pp{stage}", style="dim"), *cells)
    return grid


def _group_list(groups: list[list[int]]) -> Text:
    text = Text()
    shown = groups if len(groups) <= 16 else groups[:12]
    for i, g in enumerate(shown):
        text.append(f"{group_letter(i)}=[" + ",".join(map(str, g)) + "] ", style=PALETTE[i % len(PALETTE)])
    if len(shown) < len(groups):
        text.append(f"… ({len(groups)} groups)", style="dim")
    return text


def render_layout(world: int, groups: dict[str, list[list[int]]], tp: int, pp: int, cp: int, ep: int,
                  order: str):
    """A renderable: a header line, then one panel per interesting kind of group."""
    dp = world // (tp * pp * cp)
    header = Text(f"{world} ranks = tp {tp} × cp {cp} × dp {dp} × pp {pp}" if cp > 1 else
                  f"{world} ranks = tp {tp} × dp {dp} × pp {pp}", style="bold")
    header.append(f"   order {order}" + (f", ep {ep}" if ep > 1 else ""), style="dim")
    kinds = ["tp", "dp", "pp"] + [k for k, n in (("cp", cp), ("ep", ep)) if n > 1] + ["embd"]
    panels = []
    drawn = world <= MAX_RANKS_DRAWN  # beyond, the group lists alone: a grid would be the world's size
    stage_of = {r: rank_coordinates(r, world, tp, pp, cp, order)["pp"] for r in range(world)} if drawn else {}
    for kind in kinds:
        body = [_group_list(groups[kind])]
        if drawn:
            body.insert(0, _grid(world, groups[kind], stage_of))
        panels.append(Panel(Group(*body), title=f"{kind}: {TITLES[kind]} ({len(groups[kind])} groups "
                                               f"of {len(groups[kind][0])})", title_align="left"))
    return Group(header, Columns(panels, equal=False, expand=False))
