"""`minitron groups`: Megatron's process groups for a layout, computed without starting a process."""

from __future__ import annotations

import json
from typing import Optional

import typer

from minitron.cli.common import CP, EP, ORDERS, PP, TP, UserError, app, check_order, check_world, console, vp_option
from minitron.cli import preflight
from minitron.core.rank_generator import DEFAULT_ORDER, LAYOUT_KEYS, layout, validate_parallel_sizes


@app.command()
def groups(
    world: int = typer.Option(..., "--world", "-w", help="number of ranks"),
    tp: int = TP, pp: int = PP, cp: int = CP, ep: int = EP,
    vp: Optional[int] = vp_option("model chunks per pipeline stage (interleaved schedule); changes no "
                                  "group, shows which chunks each stage holds"),
    order: str = typer.Option(DEFAULT_ORDER, "--order", help=f"rank order: {ORDERS[0]} or {ORDERS[1]}"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object: group kind -> rank lists"),
    as_svg: bool = typer.Option(False, "--svg", help="print the grids as one SVG picture (a panel per kind)"),
):
    """Compute Megatron's process groups for a layout, without starting any process."""
    # Lazy, as every command's views and tools: `minitron --help` imports this module.
    from minitron.cli.views.layout import render_layout

    check_world(world)
    check_order(order)
    preflight.check_world_limit(world, "groups")
    try:  # the sizes' one home: validate_parallel_sizes (vp too, which changes no group)
        validate_parallel_sizes(world, tp, pp, cp, ep, vp=vp, order=order)
        groups_ = layout(world, tp, pp, cp, ep, order)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        print(json.dumps({k: groups_[k] for k in LAYOUT_KEYS}))
        return
    if as_svg:
        from minitron.cli.views.svg_grid import MAX_RANKS_DRAWN, grid_svg  # lazy: only for --svg
        if world > MAX_RANKS_DRAWN:
            raise UserError(f"--svg draws a cell per rank, at most {MAX_RANKS_DRAWN}; use --json for {world} ranks")
        dp = world // (tp * pp * cp)
        sizes = f"tp {tp} × " + (f"cp {cp} × " if cp > 1 else "") + f"dp {dp} × pp {pp}" + (f", ep {ep}" if ep > 1 else "")
        print(grid_svg(groups_, heading=f"{world} ranks = {sizes}, order {order}"), end="")
        return
    console.print(render_layout(world, groups_, tp, pp, cp, ep, order))
    if vp:
        console.print(chunk_placement(pp, vp))


def chunk_placement(pp: int, vp: int) -> str:
    """Which model chunks each stage holds under the interleaved schedule: the model is cut into
    pp x vp chunks and dealt round-robin, so stage s holds chunks s, s + pp, s + 2pp, ...
    (its vp_stage 0, 1, 2, ...). A micro-batch therefore passes every stage vp times."""
    lines = [f"virtual pipeline: {pp * vp} model chunks, {vp} per stage, dealt round-robin"]
    for stage in range(pp):
        chunks = ", ".join(str(stage + v * pp) for v in range(vp))
        lines.append(f"  stage {stage}: chunks {chunks}")
    return "\n".join(lines)
