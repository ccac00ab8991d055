"""The estimate's tables fit the terminal: every cell whole, whatever the width."""

import io

from rich.console import Console

from minitron.cli.views.fitted_table import print_fitted

HEADER = ["ranks"] + [f"group-{i}" for i in range(9)]
ROWS = [["[0-127]"] + [f"{i + 10.5:.1f} GiB" for i in range(9)], ["all"] + ["4.28 TiB"] * 9]


def printed(width: int) -> str:
    out = io.StringIO()
    print_fitted(Console(file=out, width=width, color_system=None), "memory", HEADER, ROWS, bold_last=True)
    return out.getvalue()


def test_a_wide_console_gets_the_boxed_table():
    text = printed(200)
    assert "┃ ranks" in text and text.count("[0-127]") == 1 and "…" not in text


def test_a_narrow_console_gets_every_cell_whole_in_parts_each_labelled():
    text = printed(60)
    assert "…" not in text and ("in 2 parts" in text or "in 3 parts" in text)
    assert all(len(line) <= 60 for line in text.splitlines())
    for cell in [*HEADER, *ROWS[0], *ROWS[1]]:
        assert cell in text, cell
    parts = text.count("[0-127]")
    assert parts >= 2 and text.count("all ") >= parts   # the label column repeats in every part
