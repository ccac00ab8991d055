"""The rank grid as a picture: one panel per kind of group, every group in a colour of its own.

The picture of Megatron's `initialize_model_parallel` docstring (16 GPUs, TP=2, PP=4), drawn
from the groups themselves: `minitron groups --svg` draws the computed layout, `minitron trace
--svg` the groups the ranks really created (their traced ``new_group`` calls). Each row is one
pipeline stage, read off the pipeline groups (a rank's stage is its place in its pipeline
group), so the grid needs nothing but the groups; in the default order a stage is a contiguous
block of ranks, often one machine. Every cell carries its rank, kind and group index as data
attributes and a tooltip naming the group's members, so the picture can be checked (tests/
test_svg.py) and read.
"""

from __future__ import annotations

from minitron.cli.views import svg
from minitron.cli.views.checks import group_calls
from minitron.cli.views.layout import MAX_RANKS_DRAWN, TITLES, group_letter
from minitron.core.rank_generator import DESC_TO_KEY

CELL_W, CELL_H, GAP = 40, 28, 4
LABEL_W = 40          # the "pp0" column
PANEL_GAP = 20        # at least this between two panels; a row of panels spreads over the column
MAX_WIDTH = svg.COLUMN
HEAD = 44             # a panel's title and subtitle, above its cells
NOT_IN_GROUP = "none"
# A panel is narrow: two of the layout's titles in fewer words.
PANEL_TITLES = {**TITLES, "embd": "embedding", "tp-pp": "model parallel"}


def shown_kinds(groups: dict[str, list[list[int]]]) -> list[str]:
    """tp, dp, pp always; cp and ep where they split anything; tp-pp (the model-parallel group,
    which chapters 6 and 9 use) where it is more than the tp or the pp group alone; the
    embedding group last."""
    kinds = ["tp", "dp", "pp"]
    kinds += [k for k in ("cp", "ep") if k in groups and max(len(g) for g in groups[k]) > 1]
    if "tp-pp" in groups and all(groups["tp-pp"] != groups.get(k) for k in ("tp", "pp")):
        kinds.append("tp-pp")
    return [k for k in kinds + ["embd"] if k in groups]


def stages_of(groups: dict[str, list[list[int]]]) -> dict[int, int]:
    """rank -> pipeline stage, read off the pipeline groups (stage = place in its group)."""
    return {rank: stage for group in groups["pp"] for stage, rank in enumerate(group)}


def grid_svg(groups: dict[str, list[list[int]]], kinds: list[str] | None = None, heading: str = "") -> str:
    """The panels of ``kinds`` (default: shown_kinds) as one SVG document."""
    kinds = kinds or shown_kinds(groups)
    stage_of = stages_of(groups)
    world = len(stage_of)
    if world > MAX_RANKS_DRAWN:
        raise ValueError(f"{world} ranks are too many to draw one cell each (at most {MAX_RANKS_DRAWN})")
    rows = [sorted(r for r in stage_of if stage_of[r] == s) for s in sorted(set(stage_of.values()))]
    cols = max(len(row) for row in rows)
    # + a character: a bold face runs a little wider than the 0.6 em that text_width counts
    titles = max(svg.text_width(_title(k) + " ", svg.LABEL) for k in kinds)
    panel_w = max(LABEL_W + cols * (CELL_W + GAP), titles)
    panel_h = HEAD + len(rows) * (CELL_H + GAP) + 16
    per_row = max(1, int((MAX_WIDTH + PANEL_GAP) // (panel_w + PANEL_GAP)))
    # The panels of a row spread over the whole column (the picture is set at its width).
    across = min(len(kinds), per_row)
    gap = max(PANEL_GAP, (MAX_WIDTH - across * panel_w) / (across - 1)) if across > 1 else PANEL_GAP
    top = 26 if heading else 0
    parts = [svg.text(0, 15, heading, size=svg.HEADING, font_weight="bold")] if heading else []
    for i, kind in enumerate(kinds):
        x0 = (i % per_row) * (panel_w + gap)
        y0 = top + (i // per_row) * (panel_h + PANEL_GAP)
        parts.append(_panel(kind, groups[kind], rows, x0, y0, panel_w))
    width = max(across * (panel_w + gap) - gap, MAX_WIDTH, svg.text_width(heading + " ", svg.HEADING))
    height = top + -(-len(kinds) // per_row) * (panel_h + PANEL_GAP) - PANEL_GAP
    label = heading or f"{world} ranks: " + ", ".join(f"{len(groups[k])} {k} groups" for k in kinds)
    return svg.document(width, height, parts, label)


def _panel(kind: str, kind_groups: list[list[int]], rows: list[list[int]], x0: float, y0: float, w: float) -> str:
    member = {rank: i for i, group in enumerate(kind_groups) for rank in group}
    sizes = sorted({len(g) for g in kind_groups})
    out = [f'<g data-kind="{kind}">',
           svg.text(x0, y0 + 15, _title(kind), size=svg.LABEL, font_weight="bold"),
           svg.text(x0, y0 + 15 + svg.TEXT * svg.LINE, f"{len(kind_groups)} groups of {'/'.join(map(str, sizes))}",
                    opacity="0.75")]
    for s, row in enumerate(rows):
        y = y0 + HEAD + s * (CELL_H + GAP)
        out.append(svg.text(x0, y + CELL_H * 0.68, f"pp{s}", opacity="0.7"))
        for c, rank in enumerate(row):
            x = x0 + LABEL_W + c * (CELL_W + GAP)
            out.append(_cell(kind, rank, member.get(rank), kind_groups, x, y))
    out.append("</g>")
    return "\n".join(out)


def _title(kind: str) -> str:
    return f"{kind}: {PANEL_TITLES.get(kind, kind)}"


def _cell(kind: str, rank: int, index: int | None, kind_groups: list[list[int]], x: float, y: float) -> str:
    if index is None:
        tip = f"rank {rank}: in no {kind} group"
        shape = svg.rect(x, y, CELL_W, CELL_H, "none", stroke="currentColor", stroke_opacity="0.35",
                         stroke_dasharray="3 2", rx=3)
        label = svg.text(x + CELL_W / 2, y + CELL_H * 0.68, str(rank), anchor="middle", opacity="0.5")
        group = NOT_IN_GROUP
    else:
        members = ", ".join(map(str, kind_groups[index]))
        tip = f"rank {rank}: {kind} group {group_letter(index)} = [{members}]"
        shape = svg.rect(x, y, CELL_W, CELL_H, svg.colour(index), rx=3)
        label = svg.text(x + CELL_W / 2, y + CELL_H * 0.68, str(rank), size=svg.LABEL, anchor="middle", fill=svg.INK,
                         font_weight="bold")
        group = index
    return (f'<g data-rank="{rank}" data-group="{group}">{svg.title(tip)}{shape}{label}</g>')


def groups_from_trace(records: list[dict]) -> dict[str, list[list[int]]]:
    """kind -> its groups, in creation order, from one rank's traced new_group calls (every rank
    creates every group, so any rank's record is the whole layout)."""
    groups: dict[str, list[list[int]]] = {}
    for ranks, desc, _backend in group_calls(records):
        key = DESC_TO_KEY.get(desc)
        if key is not None and list(ranks) not in groups.setdefault(key, []):
            groups[key].append(list(ranks))  # a gloo twin repeats its group: keep it once
    return groups
