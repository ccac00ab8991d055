"""`minitron groups`: Megatron's process groups for a layout, computed without starting a process."""

from __future__ import annotations

import json
from typing import Optional

import typer

from minitron.cli.common import CP, EP, ORDERS, PP, TP, UserError, app, check_order, check_world, console, vp_option
from minitron.cli import preflight
from minitron.core.rank_generator import DEFAULT_ORDER, LAYOUT_KEYS, validate_parallel_sizes
from minitron.core.group_layout import layout


@app.command()
def groups(
    world: int = typer.Option(..., "--world", "-w", help="number of ranks"),
    tp: int = TP, pp: int = PP, cp: int = CP, ep: int = EP,
    vp: Optional[int] = vp_option("model chunks per pipeline stage (interleaved schedule); changes no "
                                  "group, shows which chunks each stage holds"),
    order: str = typer.Option(DEFAULT_ORDER, "--order", help=f"rank order: {ORDERS[0]} or {ORDERS[1]}"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object: group kind -> rank lists"),
    as_svg: bool = typer.Option(False, "--svg", help="print the grids as one SVG picture (a panel per kind; "
                                                     "with --rank, the nodes holding that rank's groups)"),
    rank: Optional[int] = typer.Option(None, "--rank", help="one rank's view: its group of each kind, its "
                                                           "place in each, the nodes they span"),
):
    """Compute Megatron's process groups for a layout, without starting any process."""
    # Lazy, as every command's views and tools: `minitron --help` imports this module.
    from minitron.cli.views.layout import MAX_RANKS_DRAWN, render_layout

    check_world(world)
    check_order(order)
    preflight.check_world_limit(world, "groups")
    if rank is not None and not 0 <= rank < world:
        raise UserError(f"--rank {rank} is outside the world: choose 0..{world - 1}")
    if as_svg and rank is None and world > MAX_RANKS_DRAWN:
        raise UserError(f"--svg draws a cell per rank, at most {MAX_RANKS_DRAWN}; add --rank N to draw {world} "
                        f"ranks as nodes, with rank N's groups lit up (or use --json)")
    try:  # the sizes' one home: validate_parallel_sizes (vp too, which changes no group)
        validate_parallel_sizes(world, tp, pp, cp, ep, vp=vp, order=order)
        if rank is not None:
            return _one_rank(world, rank, tp, pp, cp, ep, order, as_json, as_svg)
        groups_ = layout(world, tp, pp, cp, ep, order)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        print(json.dumps({k: groups_[k] for k in LAYOUT_KEYS}))
        return
    if as_svg:
        # lazy: only for --svg
        from minitron.cli.views.rank_groups import layout_line
        from minitron.cli.views.svg_grid import grid_svg
        print(grid_svg(groups_, heading=layout_line(world, tp, pp, cp, ep, order)), end="")
        return
    console.print(render_layout(world, groups_, tp, pp, cp, ep, order))
    if vp:
        console.print(chunk_placement(pp, vp))


def _one_rank(world: int, rank: int, tp: int, pp: int, cp: int, ep: int, order: str, as_json: bool,
              as_svg: bool) -> None:
    """--rank N: that rank's groups alone, from its digits (no layout of the world is built)."""
    # lazy: only --rank draws these
    from minitron.cli.views.rank_groups import layout_line, rank_json, rank_view
    from minitron.cli.views.svg_nodes import nodes_svg
    from minitron.core.rank_generator import parse_order
    from minitron.core.group_layout import rank_layout

    own = rank_layout(rank, world, tp, pp, cp, ep, order)
    if as_json:
        print(json.dumps(rank_json(world, rank, own, tp, pp, cp, order)))
    elif as_svg:
        stage_blocks = parse_order(order)[-1] == "pp"  # stages are blocks of ranks only with pp slowest
        print(nodes_svg(world, rank, own, pp, stage_blocks,
                        heading=f"rank {rank} of {layout_line(world, tp, pp, cp, ep, order)}"), end="")
    else:
        console.print(rank_view(world, rank, own, tp, pp, cp, ep, order))


def chunk_placement(pp: int, vp: int) -> str:
    """Which model chunks each stage holds under the interleaved schedule: the model is cut into
    pp x vp chunks and dealt round-robin, so stage s holds chunks s, s + pp, s + 2pp, ...
    (its vp_stage 0, 1, 2, ...). A micro-batch therefore passes every stage vp times."""
    lines = [f"virtual pipeline: {pp * vp} model chunks, {vp} per stage, dealt round-robin"]
    for stage in range(pp):
        chunks = ", ".join(str(stage + v * pp) for v in range(vp))
        lines.append(f"  stage {stage}: chunks {chunks}")
    return "\n".join(lines)
