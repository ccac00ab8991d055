"""Print the chosen views of a loaded trace, the same way for `minitron trace` (which has just
run the ranks) and `minitron view` (which reads any trace directory)."""

from __future__ import annotations

from rich.console import Console

from minitron.cli.views.call_tree import call_tree
from minitron.cli.views.checks import NEW_GROUP, Check, check_lines, check_trace
from minitron.cli.views.group_table import group_table
from minitron.cli.views.schedule import pipeline_steps, render_slots
from minitron.cli.views.schedule_deepspeed import deepspeed_streams, render_beside_1f1b
from minitron.trace.reader import iterations, layout_args

VIEWS = ("tree", "groups", "checks", "schedule")
MAX_TABLE_RANKS = 64  # beyond this a row per rank is a wall; trace.json holds every rank


def parse_views(show: str) -> set[str] | None:
    """``--show tree,checks`` as a set; None for the default (every view the trace supports)."""
    if not show:
        return None
    views = {v.strip() for v in show.split(",") if v.strip()}
    unknown = views - set(VIEWS)
    if unknown:
        raise ValueError(f"--show {show!r}: unknown view {', '.join(sorted(unknown))}; choose from {', '.join(VIEWS)}")
    return views


def default_depth(runs: dict[int, list[dict]], focus: str | None) -> int | None:
    """A traced iteration nests twelve calls deep; seven levels show its shape. A focused tree
    is already small, so it is shown whole."""
    return 7 if iterations(runs) and focus is None else None


def show_views(console: Console, runs: dict[int, list[dict]], views: set[str], rank: int, *,
               focus: str | None = None, depth: int | None = None, iteration: int | None = None,
               chrome=None) -> list[Check]:
    """Print ``views`` (tree of ``rank``, groups, schedule of ``iteration``, checks); return the
    checks, so the caller can turn a failed one into its exit code."""
    if "tree" in views:
        console.print(call_tree(runs[rank], rank, depth, focus, console.width))
    if "groups" in views:
        if not any(r["name"] == NEW_GROUP for records in runs.values() for r in records):
            console.print("[dim](no new_group calls in this trace: no groups to show)[/dim]")
        elif len(runs) <= MAX_TABLE_RANKS:
            console.print(group_table(runs))
        else:
            console.print(f"[dim](group table omitted for {len(runs)} ranks" + (f"; see {chrome}" if chrome else "")
                          + ")[/dim]")
    if "schedule" in views:
        _schedule(console, runs, iteration)
    checks = check_trace(runs)
    if "checks" in views:
        for line in check_lines(checks):
            console.print(line)
    return checks


def _schedule(console: Console, runs: dict[int, list[dict]], iteration: int | None) -> None:
    done = iterations(runs)
    if not done or layout_args(next(iter(runs.values()))) is None:
        console.print("[dim](no training iteration in this trace: no schedule to show)[/dim]")
        return
    iteration = done[-1] if iteration is None else iteration
    streams = deepspeed_streams(runs, iteration=done.index(iteration) if iteration in done else None)
    if streams:   # a --deepspeed run with a pipeline: the PipelineEngine's stream, beside 1F1B
        console.print(f"[bold]pipeline schedule of iteration {iteration}[/bold] (tensor rank 0, data rank 0):")
        console.print(render_beside_1f1b(streams, width=console.width))
        return
    console.print(f"[bold]pipeline schedule of iteration {iteration}[/bold] "
                  f"(tensor rank 0, data rank 0; executed order):")
    try:
        console.print(render_slots(pipeline_steps(runs, iteration=iteration), width=console.width))
    except ValueError as exc:  # a stage's file is missing from the directory
        console.print(f"[dim](schedule not drawn: {exc})[/dim]")
