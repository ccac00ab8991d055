"""`minitron groups`, `minitron launch` and `minitron vscode`: the layout, any script on many
ranks, and the editor's attach configurations."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from minitron.cli.common import (
    DEBUG, DEBUG_HOST, DEBUG_PORT_BASE, DEBUG_WAIT, EXTRA, ORDERS, DebugOptions, UserError, app, rank_backend,
    check_order, check_world, console, validate_pretrain,
)
from minitron.core.rank_generator import DEFAULT_ORDER, LAYOUT_KEYS, layout

@app.command()
def groups(
    world: int = typer.Option(..., "--world", "-w", help="number of ranks"),
    tp: int = typer.Option(1, "--tp"), pp: int = typer.Option(1, "--pp"),
    cp: int = typer.Option(1, "--cp"), ep: int = typer.Option(1, "--ep"),
    order: str = typer.Option(DEFAULT_ORDER, "--order", help=f"{ORDERS[0]} or {ORDERS[1]}"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object: group kind -> rank lists"),
):
    """Compute Megatron's process groups for a layout, without starting any process."""
    from minitron.trace.layout_view import render_layout

    check_world(world)
    check_order(order)
    for flag, value in (("--tp", tp), ("--pp", pp), ("--cp", cp), ("--ep", ep)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")
    try:
        groups_ = layout(world, tp, pp, cp, ep, order)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if as_json:
        print(json.dumps({k: groups_[k] for k in LAYOUT_KEYS}))
    else:
        console.print(render_layout(world, groups_, tp, pp, cp, ep, order))


@app.command(context_settings=EXTRA)
def launch(
    ctx: typer.Context,
    world: int = typer.Option(..., "--world", "-w", help="number of ranks"),
    module: Optional[str] = typer.Option(None, "--module", "-m", help="run a module as __main__ (like python -m)"),
    backend: Optional[str] = typer.Option(None, "--backend", help="gloo (forked CPU ranks) or nccl (one GPU each)"),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="per-rank logs instead of this terminal"),
    master_port: Optional[int] = typer.Option(None, "--master-port"),
    trace_dir: Optional[Path] = typer.Option(None, "--trace", help="record every rank's calls into this directory"),
    debug: Optional[str] = DEBUG, debug_port_base: int = DEBUG_PORT_BASE, debug_host: str = DEBUG_HOST,
    debug_wait_timeout: float = DEBUG_WAIT,
):
    """Run SCRIPT [ARGS...] (or -m MODULE [ARGS...]) on WORLD ranks, as torchrun would."""
    from minitron.launcher import LaunchConfig, Target
    from minitron.launcher import launch as run

    check_world(world)
    backend = rank_backend(backend, world, "--backend fake plays ranks inside one process: use it with `minitron trace`")
    args = list(ctx.args)
    if module:
        target = Target(module=module, argv=args)
        if module == "minitron.pretrain_gpt":
            validate_pretrain(args, world)
    else:
        if not args:
            raise UserError("nothing to run: give a script path or -m MODULE")
        if not Path(args[0]).is_file():
            raise UserError(f"no such script: {args[0]}")
        target = Target(script=args[0], argv=args[1:])
    env = DebugOptions(debug, debug_port_base, debug_host, debug_wait_timeout).env(world, trace_dir)
    run(LaunchConfig(world_size=world, backend=backend, log_dir=log_dir, master_port=master_port, env=env), target)


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
    try:
        written = vscode_config.write_launch_json(path, world, debug_port_base, debug_host)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    console.print(f"wrote {written}: attach configurations for ranks 0..{world - 1} "
                  f"on {debug_host}:{debug_port_base}..{debug_port_base + world - 1}")
