"""Curves and bars from a run: loss and learning rate per iteration, bytes per rank.

* ``curves_svg``: small multiples sharing one x axis (the iteration), each with its own y axis,
  from the records the last rank appends to ``--log-jsonl`` (``iterations.jsonl``: lm_loss,
  lr, grad_norm, loss_scale... of every iteration);
* ``bars_svg``: one stacked bar per rank, a segment per kind of memory, measured on the ranks
  (docs/examples/memory_per_rank.py).

Every point and bar carries its value in a tooltip and a data attribute.

    python -m minitron.cli.views.svg_curves ITERATIONS_JSONL [FIELD ...]   (default: lm_loss lr)
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from minitron.cli.views import svg

WIDTH, LEFT, RIGHT, PANEL_H, GAP = svg.COLUMN, 80, 16, 150, 40
# Tick labels as large as the page's code, in full ink: at 9 px and 75 % opacity they were grey
# specks once the picture shrank to a narrow column.
TICK_SIZE = svg.TEXT
NAMES = {"lm_loss": "lm loss", "lr": "learning rate", "grad_norm": "grad norm", "loss_scale": "loss scale",
         "global_batch_size": "global batch"}


def _ticks(lo: float, hi: float, count: int = 4) -> list[float]:
    """Round numbers spanning [lo, hi]."""
    if hi <= lo:
        return [lo]
    raw = (hi - lo) / count
    step = 10 ** math.floor(math.log10(raw))
    step *= next(m for m in (1, 2, 2.5, 5, 10) if step * m >= raw)
    first = math.ceil(lo / step - 1e-9) * step
    return [first + i * step for i in range(int((hi - first) / step + 1e-9) + 1)]


def _fmt(v: float) -> str:
    return f"{v:.0e}".replace("e-0", "e-") if v and (abs(v) < 1e-2 or abs(v) >= 1e5) else f"{v:g}"


def tick_labels(ticks: list[float]) -> tuple[list[str], str]:
    """The ticks of one axis as labels a reader can compare at a glance: one number of decimals
    for all of them, and for very small or large values one shared power of ten, said once in
    the panel's title ("× 1e-3") instead of an exponent on every tick."""
    top = max((abs(t) for t in ticks), default=0)
    power = math.floor(math.log10(top)) if top and (top < 1e-2 or top >= 1e5) else 0
    scaled = [t / 10 ** power for t in ticks]
    step = min((abs(b - a) for a, b in zip(scaled, scaled[1:])), default=1) or 1
    decimals = max(0, -math.floor(math.log10(step) + 1e-9))
    if any(round(v, decimals) != round(v, decimals + 1) for v in scaled):
        decimals += 1  # a step of 2.5 needs one more
    return [f"{v:.{decimals}f}" for v in scaled], (f"× 1e{power}" if power else "")


def curves_svg(xs: list[float], series: dict[str, list[float]], heading: str = "") -> str:
    """One panel per series (name -> values over ``xs``), stacked, sharing the x axis."""
    plot_w = WIDTH - LEFT - RIGHT
    x_lo, x_hi = min(xs), max(xs)

    def sx(x):
        return LEFT + (x - x_lo) / ((x_hi - x_lo) or 1) * plot_w

    parts, y0 = [], 22.0
    if heading:
        parts.append(svg.text(0, 15, heading, size=svg.HEADING, font_weight="bold"))
        y0 = 46
    for i, (name, ys) in enumerate(series.items()):
        lo, hi = min(ys), max(ys)
        pad = (hi - lo) * 0.08 or abs(hi) * 0.1 or 1.0
        lo, hi = lo - pad, hi + pad
        if min(ys) >= 0 > lo:
            lo = 0.0

        def sy(v, top=y0, lo=lo, hi=hi):
            return top + PANEL_H - (v - lo) / (hi - lo) * PANEL_H

        ticks = _ticks(lo, hi)
        labels, times = tick_labels(ticks)
        parts.append(f'<g data-series="{name}">')
        parts.append(svg.text(LEFT, y0 - 6, " ".join(filter(None, [NAMES.get(name, name), times])), size=svg.LABEL,
                              font_weight="bold"))
        for t, label in zip(ticks, labels):
            parts.append(svg.line(LEFT, sy(t), LEFT + plot_w, sy(t), stroke_opacity="0.2"))
            parts.append(svg.text(LEFT - 6, sy(t) + 4, label, size=TICK_SIZE, anchor="end", data_tick=f"{t:g}"))
        parts.append(svg.polyline([(sx(x), sy(y)) for x, y in zip(xs, ys)], stroke=svg.colour(i), stroke_width="1.8"))
        for x, y in zip(xs, ys):
            parts.append(f'<circle cx="{sx(x):.1f}" cy="{sy(y):.1f}" r="2" fill="{svg.colour(i)}" data-x="{x:g}" '
                         f'data-y="{y!r}">{svg.title(f"iteration {x:g}: {name} {y:.6g}")}</circle>')
        parts.append("</g>")
        y0 += PANEL_H + GAP
    y_axis = y0 - GAP + 4
    for t in _ticks(x_lo, x_hi, 6):
        parts.append(svg.text(sx(t), y_axis + 14, _fmt(t), size=TICK_SIZE, anchor="middle"))
    parts.append(svg.text(LEFT + plot_w, y_axis + 34, "iteration", anchor="end"))
    label = heading or ", ".join(NAMES.get(n, n) for n in series) + " per iteration"
    return svg.document(WIDTH, y_axis + 40, parts, label)


def bars_svg(rows: dict[str, dict[str, float]], unit: str = "bytes", heading: str = "") -> str:
    """One horizontal stacked bar per row (a rank): ``rows[row][part]`` is a segment's size."""
    parts_order = list(dict.fromkeys(p for segs in rows.values() for p in segs))
    total_max = max(sum(segs.values()) for segs in rows.values()) or 1
    # the rows' names ("rank 0 pp0 dp0") and totals ("12.3 MiB") in svg.TEXT, one character spare
    label_w = max(svg.text_width(name + " ", svg.TEXT) for name in rows) + 6
    value_w, bar_h = svg.text_width("1023.9 MiB ", svg.TEXT) + 6, 24
    plot_w = WIDTH - label_w - value_w
    out, y = [], 0.0
    if heading:
        out.append(svg.text(0, 15, heading, size=svg.HEADING, font_weight="bold"))
        y = 28
    for name, segs in rows.items():
        out.append(f'<g data-row="{name}">')
        out.append(svg.text(0, y + bar_h * 0.7, name))
        x = float(label_w)
        for i, part in enumerate(parts_order):
            size = segs.get(part, 0)
            w = size / total_max * plot_w
            out.append(f'<g data-part="{part}" data-value="{size:g}">{svg.title(f"{name}: {part} {size:,.0f} {unit}")}'
                       + svg.rect(x, y, w, bar_h, svg.colour(i), stroke="#ffffff", stroke_width="0.5") + "</g>")
            x += w
        out.append(svg.text(x + 6, y + bar_h * 0.7, _human(sum(segs.values()), unit)))
        out.append("</g>")
        y += bar_h + 6
    # The legend: the kinds in a row, wrapped onto another where the column ends.
    x = float(label_w)
    for i, part in enumerate(parts_order):
        if x > label_w and x + 18 + svg.text_width(part, svg.TEXT) > WIDTH:
            x, y = float(label_w), y + svg.TEXT * svg.LINE + 4
        out.append(svg.rect(x, y + 6, 12, 12, svg.colour(i)))
        out.append(svg.text(x + 18, y + 17, part))
        x += 18 + svg.text_width(part, svg.TEXT) + 18
    return svg.document(WIDTH, y + 26, out, heading or f"{unit} per rank")


def _human(value: float, unit: str) -> str:
    if unit != "bytes":
        return f"{value:,.0f} {unit}"
    for scale, name in ((2 ** 30, "GiB"), (2 ** 20, "MiB"), (2 ** 10, "KiB")):
        if value >= scale:
            return f"{value / scale:.1f} {name}"
    return f"{value:.0f} B"


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args:
        sys.exit("usage: python -m minitron.cli.views.svg_curves ITERATIONS_JSONL [FIELD ...]")
    path, fields = Path(args[0]), args[1:] or ["lm_loss", "lr"]
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    missing = [f for f in fields if not records or f not in records[0]]
    if missing:
        sys.exit(f"{path}: no field {', '.join(missing)} in its records")
    xs = [r["iteration"] for r in records]
    print(curves_svg(xs, {f: [r[f] for r in records] for f in fields}), end="")


if __name__ == "__main__":
    main()
