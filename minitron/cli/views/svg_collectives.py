"""What each rank held before and after each collective, read from a run, as a picture.

``python docs/examples/collectives_demo.py run DIR`` runs broadcast, all-reduce, reduce-scatter,
all-gather, all-to-all and send/recv once each on 4 gloo ranks and keeps, in
DIR/collectives.json, every rank's tensor before and after each call, and the bytes it sent and
received (sizes from the trace, counted with the ring algorithm). This module draws one block
per collective: a line per rank, its values before, an arrow, its values after, its bytes.

Every cell is one element and is filled with the colour of the rank that started with that
value; grey cells hold a sum over ranks, which no single rank started with. So a broadcast is
a row turning one colour, an all-to-all a transpose of colours, and a reduce-scatter followed
by an all-gather ends where an all-reduce does.

    python -m minitron.cli.views.svg_collectives DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from minitron.cli.views import svg

# The site's sizes: the picture is the content column's width, its text the page's code size.
COLUMN, TEXT, LABEL, LINE = svg.COLUMN, svg.TEXT, svg.LABEL, svg.LINE
SUM = "#bab0ac"
CELL_W, CELL_H, ROW_H, HEAD_H, GAP = 44, 22, 27, 26, 16
BEFORE_X, AFTER_X, BYTES_X = 70, 330, 580
# What each collective does, in a line: the rule the picture's colours show.
RULE = {
    "broadcast": "rank 0's tensor, copied to every rank",
    "all-reduce": "the element-wise sum, on every rank",
    "reduce-scatter": "the sum, but rank r keeps block r of it",
    "all-gather": "every rank's block, concatenated in rank order, on every rank",
    "all-to-all": "rank r sends its block j to rank j: a transpose",
    "send/recv": "rank r sends to rank r+1 (a pipeline passing activations on)",
}


def _origin(value: float, start: dict) -> int | None:
    """The rank that started with ``value``, or None for a sum nobody started with."""
    return next((int(r) for r, values in start.items() if value in values), None)


def _cells(x: float, y: float, values: list[float], start: dict) -> list[str]:
    parts = []
    for k, value in enumerate(values):
        origin = _origin(value, start)
        fill = SUM if origin is None else svg.colour(origin)
        where = "a sum over all ranks" if origin is None else f"rank {origin}'s"
        parts += [f'<g data-value="{value:g}">', svg.title(f"{value:g}: {where}"),
                  svg.rect(x + k * CELL_W, y, CELL_W - 3, CELL_H, fill, stroke="currentColor", stroke_width="0.5"),
                  svg.text(x + k * CELL_W + (CELL_W - 3) / 2, y + CELL_H / 2 + TEXT * 0.35, f"{value:g}",
                           size=TEXT, anchor="middle", fill=svg.INK), "</g>"]
    return parts


def collectives_svg(kept: dict) -> str:
    """One block per collective of ``kept`` (collectives_demo.py's collectives.json)."""
    start = kept["start"]
    parts = [svg.text(BEFORE_X, TEXT, "before", size=TEXT, font_weight="bold"),
             svg.text(AFTER_X, TEXT, "after", size=TEXT, font_weight="bold"),
             svg.text(BYTES_X, TEXT, "bytes, by the ring algorithm", size=TEXT, font_weight="bold")]
    y = TEXT * LINE + 8
    for collective in kept["collectives"]:
        name = collective["name"]
        calls = ", ".join(sorted({c.split("(")[0] for r in collective["ranks"] for c in r["calls"]}))
        parts.append(f'<g data-collective="{name}">')
        parts.append(svg.text(0, y + LABEL, name, size=LABEL, font_weight="bold"))
        parts.append(svg.text(svg.text_width(name + "  ", LABEL), y + LABEL,
                              f"{RULE.get(name, '')}   (torch.distributed.{calls})", size=TEXT, opacity="0.85"))
        y += HEAD_H
        for rank, held in enumerate(collective["ranks"]):
            middle = y + CELL_H / 2 + TEXT * 0.35
            parts.append(svg.text(0, middle, f"rank {rank}", size=TEXT))
            parts += _cells(BEFORE_X, y, held["before"], start)
            parts.append(svg.text((BEFORE_X + 4 * CELL_W + AFTER_X) / 2, middle, "→", size=LABEL, anchor="middle"))
            parts += _cells(AFTER_X, y, held["after"], start)
            parts.append(svg.text(BYTES_X, middle, f"sent {held['sent']:>2} B   received {held['received']:>2} B",
                                  size=TEXT, opacity="0.85", style="white-space:pre"))
            y += ROW_H
        parts.append("</g>")
        y += GAP
    legend = "colour: the rank that started with the value (rank r holds 10r+1 .. 10r+4); grey: a sum over ranks"
    parts.append(svg.text(0, y + TEXT, legend, size=TEXT, opacity="0.85"))
    y += TEXT * LINE + 4
    label = (f"each rank's tensor before and after {len(kept['collectives'])} collectives on "
             f"{kept['world']} gloo ranks, with the bytes each rank sent and received")
    return svg.document(COLUMN, y, parts, label)


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 1:
        sys.exit("usage: python -m minitron.cli.views.svg_collectives DIR  "
                 "(kept by: python docs/examples/collectives_demo.py run DIR)")
    path = Path(args[0]) / "collectives.json"
    if not path.is_file():
        sys.exit(f"{path} does not exist: run `python docs/examples/collectives_demo.py run {args[0]}` first")
    print(collectives_svg(json.loads(path.read_text())), end="")


if __name__ == "__main__":
    main()
