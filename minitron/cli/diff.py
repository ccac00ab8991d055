"""`minitron diff DIR_A DIR_B`: two traced runs side by side (the view: cli/views/diff.py).

Nothing is started and torch is not imported: the two directories are read as `minitron view`
reads one.
"""

from __future__ import annotations

from pathlib import Path

import typer

from minitron.cli.common import UserError, app, console


def _read(trace_dir: Path):
    # Lazy, as every command's views: `minitron --help` imports this module, not its views.
    from minitron.cli.views.checks import layout_problem
    from minitron.trace.reader import TraceError, load_trace

    try:
        return load_trace(trace_dir, check=layout_problem)
    except TraceError as exc:
        raise UserError(str(exc)) from None


@app.command()
def diff(
    dir_a: Path = typer.Argument(..., metavar="DIR_A", help="a trace directory"),
    dir_b: Path = typer.Argument(..., metavar="DIR_B", help="another trace directory"),
):
    """Two traced runs side by side: groups, collectives per group kind, time per phase, and
    the calls only one of them makes."""
    from minitron.cli.views.diff import diff_tables, layout_line, summarize  # lazy: as in _read

    a, b = summarize(_read(dir_a)), summarize(_read(dir_b))
    # soft_wrap: rich would break these lines at a space after a long path, or inside the path
    # itself when it is wider than the terminal; one line per run keeps the path copyable.
    console.print(f"A = {dir_a}: {layout_line(a)}", highlight=False, soft_wrap=True)
    console.print(f"B = {dir_b}: {layout_line(b)}", highlight=False, soft_wrap=True)
    for part in diff_tables(a, b, "A", "B"):
        console.print(part)
