"""A huge job as a grid of nodes, one rank's groups lit up: where its peers live.

A cell per rank (svg_grid.py) stops at 64 ranks; a 16,384-rank job is 2,048 nodes of 8 GPUs.
Here each cell is a node, and each panel shows one kind of group of one chosen rank: the nodes
holding a member of its group are filled (darker where more of the node's 8 GPUs are members),
its own node is outlined. Read top to bottom, the panels say what Megatron's rank order is for:
the tensor-parallel group fits in one node (NVLink), the context- and expert-parallel groups
in a few neighbours, while the data- and pipeline-parallel groups reach across the machine
room. Kinds whose group stays inside the rank's own node get a line of text, not a panel.

The background grid is one rectangle filled with a repeating pattern, so the picture stays a
few kilobytes however many nodes it shows; only the lit nodes are drawn one by one, each with
a tooltip and data attributes (data-kind, data-node, data-members) that tests read.
"""

from __future__ import annotations

from minitron.cli.views import svg
from minitron.cli.views.layout import TITLES
from minitron.cli.views.svg_grid import PANEL_GAP
from minitron.cli.views.words import rank_ranges

GPUS_PER_NODE = 8     # a DGX-style node: the tensor-parallel group is meant to fit inside one
ROW_NODES = 64        # nodes per row: 64 cells of CELL + GAP fill the page's content column (svg.COLUMN)
CELL, GAP = 14, 1
LABEL_W = 48          # the "pp0" column
TOP = 24              # the heading; the legend's lines follow
PANEL_HEAD = 40       # a panel's title and subtitle
STEP = svg.TEXT * svg.LINE   # one legend line below the other
KINDS = ("tp", "cp", "ep", "pp", "embd", "dp")   # nearest first: the order the text tells it in


def node_rows(world: int, pp: int, stage_blocks: bool) -> tuple[int, list[str]]:
    """(nodes per row, each row's label). With each pipeline stage a contiguous block of whole
    nodes (the default order), a stage starts a row, labelled pp0, pp1, ...; else plain rows of
    ROW_NODES nodes, labelled by their first node."""
    nodes = -(-world // GPUS_PER_NODE)
    per_stage = world // pp // GPUS_PER_NODE if stage_blocks and (world // pp) % GPUS_PER_NODE == 0 else 0
    if per_stage:
        per_row = min(per_stage, ROW_NODES)
        rows_per_stage = -(-per_stage // per_row)
        labels = [f"pp{s}" if r == 0 else "" for s in range(pp) for r in range(rows_per_stage)]
        return per_row, labels
    return ROW_NODES, [f"n{first}" for first in range(0, nodes, ROW_NODES)]


def nodes_svg(world: int, rank: int, own: dict[str, list[int]], pp: int, stage_blocks: bool,
              heading: str = "") -> str:
    """The node grid of a ``world``-rank job, a panel for each kind (KINDS) whose group of
    ``rank`` (``own``: kind -> its group) leaves the rank's node."""
    per_row, labels = node_rows(world, pp, stage_blocks)
    home = rank // GPUS_PER_NODE
    wide = [k for k in KINDS if k in own and {r // GPUS_PER_NODE for r in own[k]} != {home}]
    local = [k for k in KINDS if k in own and k not in wide and len(own[k]) > 1]
    pitch = CELL + GAP
    grid_h = len(labels) * pitch
    width = LABEL_W + per_row * pitch
    pid = f"nodes-{world}-{rank}"  # pattern ids are page-wide: one per picture
    parts = [f'<defs><pattern id="{pid}" width="{pitch}" height="{pitch}" patternUnits="userSpaceOnUse">'
             + svg.rect(0, 0, CELL, CELL, "currentColor", fill_opacity="0.08") + "</pattern></defs>"]
    if heading:
        parts.append(svg.text(0, 15, heading, size=svg.HEADING, font_weight="bold"))
    legend = [f"a cell is a node of {GPUS_PER_NODE} GPUs ({-(-world // GPUS_PER_NODE):,} nodes); filled: it holds",
              f"members of rank {rank}'s group (darker: more of its GPUs); outlined: node {home}, rank {rank}'s own"]
    inside = "; ".join(f"{k} {rank_ranges(own[k])}" for k in local)
    legend.append(f"inside node {home}: {inside}" if inside else f"node {home} holds no whole group of it")
    for i, line in enumerate(legend):
        parts.append(svg.text(0, TOP + 14 + STEP * i, line, opacity="0.8"))
    y = TOP + 14 + STEP * len(legend)
    for i, kind in enumerate(wide):
        parts.append(_panel(kind, own[kind], rank, i, y, per_row, labels, pid))
        y += PANEL_HEAD + grid_h + PANEL_GAP
    label = heading or f"{world} ranks as nodes: rank {rank}'s groups"
    # + a character: a bold face runs a little wider than the 0.6 em that text_width counts
    widest = max([width, svg.COLUMN, svg.text_width(heading + " ", svg.HEADING)]
                 + [svg.text_width(line + " ", svg.TEXT) for line in legend])
    return svg.document(widest, y - PANEL_GAP, parts, label)


def _panel(kind: str, group: list[int], rank: int, index: int, y0: float, per_row: int, labels: list[str],
           pid: str) -> str:
    pitch = CELL + GAP
    members: dict[int, int] = {}
    for r in group:
        members[r // GPUS_PER_NODE] = members.get(r // GPUS_PER_NODE, 0) + 1
    where = f"{len(group):,} ranks on {len(members):,} node{'s' if len(members) > 1 else ''}"
    out = [f'<g data-kind="{kind}" data-nodes="{len(members)}">',
           svg.text(0, y0 + 15, f"{kind}: {TITLES.get(kind, kind)}", size=svg.LABEL, font_weight="bold"),
           svg.text(0, y0 + 15 + STEP, f"rank {rank}'s group: {where}", opacity="0.75")]
    top = y0 + PANEL_HEAD
    for row, text in enumerate(labels):
        if text:
            out.append(svg.text(0, top + row * pitch + CELL - 1, text, opacity="0.7"))
    out.append(svg.rect(LABEL_W, top, per_row * pitch, len(labels) * pitch, f"url(#{pid})"))
    fill, home = svg.colour(index), rank // GPUS_PER_NODE
    for node, count in sorted(members.items()):
        x, y = LABEL_W + (node % per_row) * pitch, top + (node // per_row) * pitch
        first = node * GPUS_PER_NODE
        tip = (f"node {node} (ranks {first}-{first + GPUS_PER_NODE - 1}): {count} of rank {rank}'s {kind} group"
               + (" (its own node)" if node == home else ""))
        ring = {"stroke": "currentColor", "stroke_width": "1.5"} if node == home else {}
        out.append(f'<g data-node="{node}" data-members="{count}">{svg.title(tip)}'
                   + svg.rect(x, y, CELL, CELL, fill, fill_opacity=f"{0.55 + 0.45 * count / GPUS_PER_NODE:.2f}",
                              **ring) + "</g>")
    out.append("</g>")
    return "\n".join(out)
