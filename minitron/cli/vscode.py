"""`minitron vscode`: write the editor's attach configurations, one per rank and one for all."""

from __future__ import annotations

from pathlib import Path

import typer

from minitron.cli.common import DEBUG_HOST, DEBUG_PORT_BASE, UserError, app, check_world, console
from minitron.cli import preflight


@app.command()
def vscode(
    world: int = typer.Option(..., "--world", "-w", help="number of ranks to attach to"),
    debug_port_base: int = DEBUG_PORT_BASE,
    debug_host: str = DEBUG_HOST,
    path: Path = typer.Option(Path(".vscode/launch.json"), "--path", help="launch.json to write or merge into"),
):
    """Write (or merge into) .vscode/launch.json: one attach configuration per rank, and all ranks."""
    from minitron.launcher import vscode as vscode_config  # lazy: --help does not load the launcher

    check_world(world)
    preflight.check_output_file(path, "--path")
    try:
        written = vscode_config.write_launch_json(path, world, debug_port_base, debug_host)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    console.print(f"wrote {written}: attach configurations for ranks 0..{world - 1} "
                  f"on {debug_host}:{debug_port_base}..{debug_port_base + world - 1}")
