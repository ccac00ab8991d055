"""`minitron groups` and `minitron vscode`: the layout, and the editor's attach configurations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from minitron.cli.common import (
    DEBUG, DEBUG_HOST, DEBUG_PORT_BASE, DEBUG_WAIT, EXTRA, ORDERS, DebugOptions, UserError, app, rank_backend,
    check_order, check_world, console, validate_pretrain,
)
from minitron.cli import preflight
from minitron.cli.command import expand_aliases
from minitron.core.rank_generator import DEFAULT_ORDER, LAYOUT_KEYS, layout

@app.command()
def groups(
    world: int = typer.Option(..., "--world", "-w", help="number of ranks"),
    tp: int = typer.Option(1, "--tp", "--tensor-model-parallel-size", help="tensor-parallel size"),
    pp: int = typer.Option(1, "--pp", "--pipeline-model-parallel-size", help="pipeline-parallel size (stages)"),
    cp: int = typer.Option(1, "--cp", "--context-parallel-size", help="context-parallel size"),
    ep: int = typer.Option(1, "--ep", "--expert-model-parallel-size", help="expert-parallel size"),
    vp: Optional[int] = typer.Option(None, "--vp", "--virtual-pipeline-model-parallel-size",
                                     help="model chunks per pipeline stage (interleaved schedule); "
                                          "changes no group, shows which chunks each stage holds"),
    order: str = typer.Option(DEFAULT_ORDER, "--order", help=f"rank order: {ORDERS[0]} or {ORDERS[1]}"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object: group kind -> rank lists"),
):
    """Compute Megatron's process groups for a layout, without starting any process."""
    from minitron.trace.layout_view import render_layout

    check_world(world)
    check_order(order)
    for flag, value in (("--tp", tp), ("--pp", pp), ("--cp", cp), ("--ep", ep), ("--vp", vp or 1)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    if vp and pp < 2:
        raise UserError(f"--vp {vp} needs pipeline stages to interleave: give --pp 2 or more")
    preflight.check_world_limit(world, "groups")
    try:
        groups_ = layout(world, tp, pp, cp, ep, order)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        print(json.dumps({k: groups_[k] for k in LAYOUT_KEYS}))
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


@app.command()
def vscode(
    world: int = typer.Option(..., "--world", "-w", help="number of ranks to attach to"),
    debug_port_base: int = DEBUG_PORT_BASE,
    debug_host: str = DEBUG_HOST,
    path: Path = typer.Option(Path(".vscode/launch.json"), "--path", help="launch.json to write or merge into"),
):
    """Write (or merge into) .vscode/launch.json: one attach configuration per rank, and all ranks."""
    from minitron.launcher import vscode as vscode_config

    check_world(world)
    preflight.check_output_file(path, "--path")
    try:
        written = vscode_config.write_launch_json(path, world, debug_port_base, debug_host)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    console.print(f"wrote {written}: attach configurations for ranks 0..{world - 1} "
                  f"on {debug_host}:{debug_port_base}..{debug_port_base + world - 1}")
