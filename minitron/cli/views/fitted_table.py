"""A table that fits the terminal instead of cutting its cells short.

rich shortens a no-wrap cell that does not fit ("17.1 G…"), which hides the one number a reader
came for. The estimate's tables grow a column per group kind, so on an 80-column terminal (or a
page of the walkthrough) they often do not fit. Here the same rows are tried three ways: as a
boxed table; without the vertical lines between columns (each column then costs one character
less, and the edges two); and, if that is still too wide, cut into as many tables as it takes,
each repeating the first column so that every row keeps its label.
"""

from __future__ import annotations

from rich import box
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table


def _table(title: str | None, header: list[str], rows: list[list[str]], columns: list[int], lines: bool,
           bold_last: bool, justify: dict[int, str]) -> Table:
    table = Table(title=title, title_style="bold", box=box.HEAVY_HEAD if lines else box.SIMPLE_HEAD,
                  pad_edge=lines, collapse_padding=not lines)
    for i in columns:
        table.add_column(header[i], justify=justify.get(i, "right"), no_wrap=True)
    for n, row in enumerate(rows):
        bold = bold_last and n == len(rows) - 1
        table.add_row(*[row[i] for i in columns], style="bold" if bold else None)
    return table


def _fits(console: Console, table: Table) -> bool:
    """Would ``table`` print at full width? (console.measure caps its answer at the width.)"""
    unbounded = console.options.update_width(1_000_000)
    return Measurement.get(console, unbounded, table).maximum <= console.width


def print_fitted(console: Console, title: str, header: list[str], rows: list[list[str]], *,
                 bold_last: bool = False, justify: dict[int, str] | None = None) -> None:
    """Print ``rows`` under ``header``; columns are right-justified unless ``justify`` (column
    index -> "left"/"center") says otherwise; ``bold_last`` sets a totals row in bold."""
    justify = {0: "left", **(justify or {})}
    every = list(range(len(header)))
    for lines in (True, False):
        table = _table(title, header, rows, every, lines, bold_last, justify)
        if _fits(console, table):
            console.print(table)
            return
    # Still too wide: deal the columns after the first into tables that each fit.
    parts, current = [], [0]
    for i in every[1:]:
        trial = _table(title, header, rows, current + [i], False, bold_last, justify)
        if len(current) > 1 and not _fits(console, trial):
            parts.append(current)
            current = [0]
        current.append(i)
    parts.append(current)
    console.print(f"[bold]{title}[/bold] (in {len(parts)} parts, to fit {console.width} columns)", highlight=False)
    for columns in parts:
        console.print(_table(None, header, rows, columns, False, bold_last, justify))
