"""`minitron trace --svg`: the pictures a traced run draws of itself, beside its trace.

A whole small world gets its executed groups as rank grids (svg_grid.py) and the last traced
iteration's pipeline schedule as a timeline (svg_timeline.py); a play of chosen ranks of a large
world (--ranks) gets the nodes holding one rank's groups instead (svg_nodes.py), since a grid of
thousands of ranks would show nothing. Each drawing module is imported only when it draws.
"""

from __future__ import annotations

from pathlib import Path
from typing import List


def write_pictures(out: Path, runs: dict, rank: int) -> List[Path]:
    """--svg: the executed groups as rank grids, and the last traced iteration's schedule as a
    timeline (minitron/cli/views/svg_grid.py, svg_timeline.py); what the trace cannot show
    (more ranks than a grid draws, no iteration) is left out. A play of chosen ranks (--ranks)
    draws the nodes holding ``rank``'s executed groups instead (svg_nodes.py)."""
    # lazy: only --svg draws
    from minitron.cli.views.schedule import pipeline_steps
    from minitron.cli.views.svg_grid import MAX_RANKS_DRAWN, grid_svg, groups_from_trace
    from minitron.cli.views.svg_timeline import timeline_svg
    from minitron.trace.reader import iterations, played_ranks

    written = []
    if played_ranks(runs):  # a few ranks of a large world: the nodes holding the shown rank's groups
        return [_nodes_picture(out, runs, rank)]
    groups = groups_from_trace(runs[min(runs)])
    if "pp" in groups and len(runs) <= MAX_RANKS_DRAWN:
        (out / "groups.svg").write_text(grid_svg(groups, heading=f"{len(runs)} ranks: the groups they created"))
        written.append(out / "groups.svg")
    done = iterations(runs)
    stages = pipeline_steps(runs, iteration=done[-1]) if done else {}
    if any(stages.values()):
        pp = len(stages)
        (out / "schedule.svg").write_text(timeline_svg([(f"iteration {done[-1]}, {pp} stages", stages)]))
        written.append(out / "schedule.svg")
    return written


def _nodes_picture(out: Path, runs: dict, rank: int) -> Path:
    # lazy: only --svg with --ranks draws this
    from minitron.cli.views.checks import group_calls
    from minitron.cli.views.rank_groups import layout_line
    from minitron.cli.views.svg_nodes import nodes_svg
    from minitron.core.rank_generator import DESC_TO_KEY, parse_order
    from minitron.trace.reader import layout_args, world_size_of

    sizes, world = layout_args(runs[rank]), world_size_of(runs)
    own = {DESC_TO_KEY[desc]: list(ranks) for ranks, desc, _ in group_calls(runs[rank]) if desc in DESC_TO_KEY}
    heading = f"rank {rank} of {layout_line(world, sizes['tp'], sizes['pp'], sizes['cp'], sizes['ep'], sizes['order'])}"
    picture = out / "nodes.svg"
    picture.write_text(nodes_svg(world, rank, own, sizes["pp"], parse_order(sizes["order"])[-1] == "pp", heading))
    return picture
