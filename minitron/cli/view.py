"""`minitron view DIR`: read any trace directory back and show it.

The ranks write the same files however they were started — `minitron trace`, `launch --trace
DIR`, `pretrain --trace DIR`, or torchrun with MINITRON_TRACE_DIR=DIR set — so one command reads
them all: one rank's call tree, the groups, the checks, the pipeline schedule when an iteration
was traced, and a fresh `trace.json` for Perfetto. With ``--hang``, why the job hung instead
(cli/views/hang.py), from the same files, even those of a job killed while it waited. Nothing is started, and nothing is imported
that the views do not need: torch stays out of this process.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from minitron.cli.common import UserError, app, console


def _layout_problem(runs):
    # Lazy: the reader calls this only once every record passed its own checks, so a bad
    # record is refused before any view module loads.
    from minitron.cli.views.checks import layout_problem

    return layout_problem(runs)


@app.command()
def view(
    trace_dir: Path = typer.Argument(..., metavar="DIR", help="a trace directory (rank*.jsonl files)"),
    rank: Optional[int] = typer.Option(None, "--rank", help="whose call tree to print (default: the first rank "
                                                           "the directory holds)"),
    focus: Optional[str] = typer.Option(None, "--focus", help="show only the calls named NAME (a function name "
                                                              "or pattern: train_step, '*forward*') and what ran inside"),
    depth: Optional[int] = typer.Option(None, "--depth", help="call-tree depth (default: all; 7 when the trace "
                                                              "holds training iterations, unless --focus)"),
    show: str = typer.Option("", "--show", help="comma list of views: tree, groups, checks, schedule "
                                               "(default: all that apply)"),
    iteration: Optional[int] = typer.Option(None, "--iteration", help="the iteration the schedule shows "
                                                                      "(default: the last one traced)"),
    hang: bool = typer.Option(False, "--hang", help="why the job hung: which group waits in which call, which "
                                                    "ranks never came and where they are (any trace, even a killed job's)"),
    as_json: bool = typer.Option(False, "--json", help="with --hang: the diagnosis as JSON"),
):
    """Show any trace directory (trace, launch, pretrain, torchrun) and write its trace.json.

    Under torchrun, set MINITRON_TRACE_DIR=DIR for the ranks, then `minitron view DIR`.
    """
    # Lazy: the reader and the views (rich's tables and trees) load when the command runs, not
    # for `--help`; the reader first, so that a bad trace is refused before the views load.
    from minitron.trace.reader import TraceError, backend_of, iterations, played_ranks, read_trace, world_size_of

    if depth is not None and depth < 1:
        raise UserError(f"--depth must be 1 or more, got {depth}")
    if as_json and not hang:
        raise UserError("--json prints the hang diagnosis: add --hang")
    if hang:
        return _show_hang(trace_dir, as_json)
    try:
        runs, cut = read_trace(trace_dir, check=_layout_problem)
    except TraceError as exc:
        raise UserError(str(exc)) from None
    # Lazy, as the reader above.
    from minitron.cli.views.call_tree import FocusError
    from minitron.cli.views.perfetto import write_chrome_trace
    from minitron.cli.views.show import VIEWS, default_depth, parse_views, show_views
    from minitron.cli.views.words import plural, rank_ranges

    try:
        views = parse_views(show)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    rank = min(runs) if rank is None else rank  # a partial trace (trace --ranks) may hold no rank 0
    if rank not in runs:
        raise UserError(f"--rank {rank}: {trace_dir} holds the files of ranks {rank_ranges(list(runs))}")
    done = iterations(runs)
    if views is None:
        views = set(VIEWS) if done else set(VIEWS) - {"schedule"}
    elif "schedule" in views and not done:
        raise UserError(f"--show schedule: {trace_dir} holds no training iteration (trace one with --steps 1, "
                        f"or pretrain --trace)")
    if iteration is not None and iteration not in done:
        raise UserError(f"--iteration {iteration}: the trace holds iterations {rank_ranges(done) if done else 'none'}")

    fake = backend_of(runs) == "fake"
    try:
        chrome = write_chrome_trace(trace_dir, runs, "fake backend: collectives did not communicate" if fake else None)
    except OSError as exc:
        raise UserError(f"cannot write {trace_dir / 'trace.json'}: {exc.strerror}") from None
    try:
        checks = show_views(console, runs, views, rank, focus=focus,
                            depth=depth if depth is not None else default_depth(runs, focus),
                            iteration=iteration, chrome=chrome)
    except FocusError as exc:
        raise UserError(str(exc)) from None
    if cut:
        console.print(f"[yellow]the last line of {plural(len(cut), 'rank')} {rank_ranges(cut)} was cut short "
                      f"(stopped mid-write) and is skipped[/yellow]")
    pids = len({recs[0]["pid"] for recs in runs.values() if recs})
    backend = backend_of(runs) or "backend not recorded"
    held = f"{len(runs)} of {world_size_of(runs):,} ranks, played by choice" if played_ranks(runs) else \
        plural(len(runs), 'rank')
    console.print(f"{held} ({backend}, {plural(pids, 'process', 'processes')}) "
                  f"→ {chrome} (open in https://ui.perfetto.dev)")
    if fake:
        console.print("[yellow]fake backend: ranks played in turn, no process of their own; collectives moved no data[/yellow]")
    if any(c.ok is False for c in checks):
        raise typer.Exit(1)


def _show_hang(trace_dir: Path, as_json: bool) -> None:
    """`view DIR --hang`: the hang screen (cli/views/hang.py) from the files alone."""
    # Lazy, as view's own imports: a bad trace is refused before the screen loads.
    from minitron.trace.hang import diagnose
    from minitron.trace.reader import TraceError

    try:
        if as_json:
            print(json.dumps(diagnose(trace_dir), indent=1))
            return
        from minitron.cli.views.hang import show_hang   # lazy: the screen loads only when shown, not for --json
        show_hang(console, trace_dir)
    except TraceError as exc:
        raise UserError(str(exc)) from None
