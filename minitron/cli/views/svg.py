"""SVG text, written by hand: the few shapes the pictures need, and one document around them.

The pictures (svg_grid.py: rank grids, svg_timeline.py: pipeline schedules, svg_curves.py:
loss, learning rate and bytes per rank, svg_shapes.py: tensor shapes through a layer) are drawn
from a run's own data, for the site and for `minitron trace --svg`. SVG is plain text, so a
plotting library would only add a dependency and a style of its own; these helpers keep every
picture in the same style:

* text is drawn in ``currentColor``, so a page's dark theme turns it light, and a file opened
  on its own shows it black;
* the fills are mid-light colours (Tableau's ten, then lighter and darker variants of them)
  under dark text, readable on a light and a dark page alike;
* a document is drawn on a canvas COLUMN units wide, the site's content column at a laptop's
  width (1280 px), and is set ``width: 100%``: there one unit is one pixel, so a text of
  TEXT units is as large as the page's code (12.8 px), and the picture fills the column
  instead of sitting at two thirds of it with 9 px print (issue #40). On a narrower page it
  shrinks with the column. tests/test_pages_browser.py measures both on every page.
"""

from __future__ import annotations

from xml.sax.saxutils import escape, quoteattr

BASE = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1", "#ff9da7",
        "#9c755f", "#bab0ac")
INK = "#1b1b1b"          # text on a coloured fill
FONT = "ui-monospace, SFMono-Regular, Menlo, Consolas, 'DejaVu Sans Mono', monospace"
CHAR_W = 0.6             # a monospace character's width, in units of the font size
COLUMN = 1030            # px: the content column at 1280 px (docs/stylesheets/output.css)
TEXT = 13                # the smallest text: the page's code is 12.8 px, and this is no smaller
LABEL = 14               # titles of a panel or a row
HEADING = 15             # a picture's own heading
LINE = 1.3               # a line's height, in units of the font size: stacked lines never touch


def _mix(colour: str, other: int, amount: float) -> str:
    rgb = [int(colour[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (other - c) * amount):02x}" for c in rgb)


PALETTE = BASE + tuple(_mix(c, 255, 0.45) for c in BASE) + tuple(_mix(c, 0, 0.3) for c in BASE)


def colour(index: int) -> str:
    """The fill of group ``index``: thirty distinct colours, then they repeat."""
    return PALETTE[index % len(PALETTE)]


def text_width(text: str, size: float) -> float:
    return len(text) * size * CHAR_W


def _attrs(attrs: dict) -> str:
    return "".join(f" {k.rstrip('_').replace('_', '-')}={quoteattr(str(v))}" for k, v in attrs.items()
                   if v is not None)


def rect(x, y, w, h, fill, **attrs) -> str:
    return f'<rect x="{x:.1f}" y="{y:.1f}" width="{max(w, 0):.1f}" height="{max(h, 0):.1f}" fill="{fill}"{_attrs(attrs)}/>'


def line(x1, y1, x2, y2, **attrs) -> str:
    attrs.setdefault("stroke", "currentColor")
    return f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}"{_attrs(attrs)}/>'


def polyline(points, **attrs) -> str:
    attrs.setdefault("fill", "none")
    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in points)
    return f'<polyline points="{pts}"{_attrs(attrs)}/>'


def text(x, y, body: str, size: float = TEXT, anchor: str = "start", fill: str = "currentColor", **attrs) -> str:
    return (f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}" fill="{fill}"'
            f'{_attrs(attrs)}>{escape(body)}</text>')


def title(body: str) -> str:
    """A tooltip for the element it is put in (and a name for screen readers)."""
    return f"<title>{escape(body)}</title>"


def document(width: float, height: float, parts: list[str], label: str) -> str:
    """A standalone SVG document: ``label`` is its accessible name and its tooltip."""
    width, height = round(width), round(height)
    head = (f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {width} {height}" width="{width}" '
            f'height="{height}" role="img" aria-label={quoteattr(label)} font-family={quoteattr(FONT)} '
            f'style="width:100%;height:auto">')
    return "\n".join([head, title(label), *parts, "</svg>"]) + "\n"
