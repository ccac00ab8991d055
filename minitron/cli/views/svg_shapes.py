"""Tensor shapes through a tensor-parallel pair, read from a traced run, as a picture.

``scripts/tp_pair_trace.py --keep DIR`` traces ``ColumnParallelLinear -> GeLU ->
RowParallelLinear`` on tensor-parallel ranks. From rank 0's records this module draws what
rank 0 holds at each point of the forward pass, every tensor as its full ``[s, h]`` outline
(the micro-batch dimension ``b`` left out) with rank 0's part filled in:

* grey: the whole tensor, the same on every rank (replicated);
* orange: rank 0's part of the *sequence* (sequence-parallel region);
* blue: rank 0's part of the *hidden* dimension (the tensor-parallel region between the two
  layers); green: a full-size tensor of partial sums, before the reduction that completes it.

Between the tensors stand the operations with the collective each one ran (its group and
shape as traced), and under each column the collectives of the backward pass, in order. Every
shape in the picture is a traced one (layer inputs and weights, collective inputs) or follows
from them (a layer's output is ``[s, b, rows of its weight]``).

    python -m minitron.cli.views.svg_shapes TITLE=TRACE_DIR ...
"""

from __future__ import annotations

import sys

from minitron.cli.views import svg
from minitron.trace.reader import TraceError, load_trace

COLUMN = "minitron.core.tensor_parallel.layers.ColumnParallelLinear.forward"
ROW = "minitron.core.tensor_parallel.layers.RowParallelLinear.forward"
FILL = {None: "#bab0ac", "seq": "#f28e2b", "hidden": "#4e79a7", "partial": "#59a14f"}
SAY = {None: "whole, on every rank", "seq": "rank 0's part of the sequence",
       "hidden": "rank 0's part of the hidden dim", "partial": "partial sums (rank 0's share)"}
# Two columns side by side fill the page's column (svg.COLUMN); a column's text folds at WRAP
# characters of svg.TEXT, and a line is svg.LINE of its size below the one before.
COL_W, TENSOR_H, OP_H = (svg.COLUMN + 20) / 2, 50, 30
WRAP = int((COL_W - 22 - 20) / svg.text_width("x", svg.TEXT))
STEP = svg.TEXT * svg.LINE


def _shape(record: dict, key: str) -> list[int]:
    return list(record["args"][key]["tensor"])


def _collectives(by_parent: dict, record: dict) -> list[dict]:
    """The torch.distributed calls anywhere under ``record``."""
    out, stack = [], [record]
    while stack:
        node = stack.pop()
        for kid in by_parent.get(node["id"], []):
            if kid["name"].startswith("torch.distributed."):
                out.append(kid)
            stack.append(kid)
    return sorted(out, key=lambda r: r["start_us"])


def _op(name: str) -> str:
    return name.removeprefix("torch.distributed.").replace("_into_tensor", "").replace("_tensor", "")


def pair_steps(records: list[dict]) -> tuple[list[tuple], list[str], int]:
    """([("tensor", name, local, full, split) | ("op", text)], backward collectives, tp)."""
    by_parent: dict = {}
    for r in records:
        by_parent.setdefault(r["parent"], []).append(r)
    column = next(r for r in records if r["name"] == COLUMN)
    row = next(r for r in records if r["name"] == ROW)
    backward = next(r for r in records if r["name"].endswith(".backward") and r["parent"] is None
                    or r["name"] == "tp_pair.backward")
    col_comm, row_comm = _collectives(by_parent, column), _collectives(by_parent, row)
    reduce = row_comm[0]
    tp = len(reduce["args"]["ranks"])
    x = _shape(column, "input")
    w_col, w_row = _shape(column, "weight"), _shape(row, "weight")
    seq, b = _shape(row, "input")[0], x[1]
    group = f"{reduce['args']['group']} {reduce['args']['ranks']}"
    steps = [("tensor", "x", x, [seq, b, x[2]], "seq" if x[0] < seq else None)]
    if col_comm:
        steps += [("op", f"{_op(col_comm[0]['name'])} {col_comm[0]['args']['shape']} over {group}"),
                  ("tensor", "x, gathered", [seq, b, x[2]], [seq, b, x[2]], None)]
    else:
        steps += [("op", "f: nothing in the forward pass (an all-reduce in the backward)")]
    steps += [("op", f"ColumnParallelLinear: W {w_col} = rows of [{w_col[0] * tp}, {w_col[1]}]; GeLU"),
              ("tensor", "h", [seq, b, w_col[0]], [seq, b, w_col[0] * tp], "hidden"),
              ("op", f"RowParallelLinear: W {w_row} = columns of [{w_row[0]}, {w_row[1] * tp}]"),
              ("tensor", "partial y", [seq, b, w_row[0]], [seq, b, w_row[0]], "partial"),
              ("op", f"{_op(reduce['name'])} {reduce['args']['shape']} over {group}")]
    scattered = "scatter" in reduce["name"]
    steps.append(("tensor", "y", [seq // tp if scattered else seq, b, w_row[0]], [seq, b, w_row[0]],
                  "seq" if scattered else None))
    return steps, [_op(r["name"]) for r in _collectives(by_parent, backward)], tp


def shapes_svg(columns: list[tuple[str, list[dict]]]) -> str:
    """One column per traced run (title, rank 0's records), side by side."""
    parsed = [(title, *pair_steps(records)) for title, records in columns]
    widest = max(full[2] for _, steps, _, _ in parsed for s in steps if s[0] == "tensor" for full in [s[3]])
    tallest = max(full[0] for _, steps, _, _ in parsed for s in steps if s[0] == "tensor" for full in [s[3]])
    unit = min(4.0, 120 / widest, (TENSOR_H - 16) / tallest)
    parts, height = [], 0.0
    for i, (title, steps, backward, tp) in enumerate(parsed):
        x0 = i * COL_W
        parts.append(svg.text(x0, 15, title, size=svg.HEADING, font_weight="bold"))
        y = 26.0
        for step in steps:
            if step[0] == "op":
                pieces = _wrap(step[1], WRAP)
                parts.append(svg.text(x0 + 6, y + 14, "↓", size=svg.LABEL))
                for k, piece in enumerate(pieces):
                    parts.append(svg.text(x0 + 22, y + 14 + STEP * k, piece, opacity="0.85"))
                y += max(OP_H, 10 + STEP * len(pieces))
            else:
                parts.append(_tensor(x0, y, step, unit))
                y += TENSOR_H
        # Folded like the op lines: a column is COL_W wide, and the last one ends the picture.
        footer = _wrap("backward, as traced: " + ", then ".join(backward), WRAP)
        for k, piece in enumerate(footer):
            parts.append(svg.text(x0, y + 14 + STEP * k, piece, opacity="0.85"))
        height = max(height, y + 10 + STEP * len(footer))
    label = "tensor shapes on rank 0 through ColumnParallelLinear -> GeLU -> RowParallelLinear: " + \
        "; ".join(title for title, _ in columns)
    return svg.document(COL_W * len(columns) - 20, height, parts, label)


def _tensor(x0: float, y: float, step: tuple, unit: float) -> str:
    _, name, local, full, split = step
    fw, fh = full[2] * unit, full[0] * unit
    lw, lh = local[2] * unit, local[0] * unit
    tip = f"{name}: rank 0 holds {local} of {full} ([s, b, h]); {SAY[split]}"
    return "".join([
        f'<g data-tensor="{name}" data-shape="{local}" data-full="{full}">', svg.title(tip),
        svg.rect(x0 + 2, y + 2, fw, fh, "none", stroke="currentColor", stroke_opacity="0.5", stroke_dasharray="3 2"),
        svg.rect(x0 + 2, y + 2, lw, lh, FILL[split], stroke="currentColor", stroke_width="0.6"),
        svg.text(x0 + 130, y + 16, f"{name}  {local}", size=svg.LABEL, font_weight="bold"),
        svg.text(x0 + 130, y + 16 + svg.LABEL * svg.LINE, SAY[split], opacity="0.8"), "</g>"])


def _wrap(text: str, width: int) -> list[str]:
    lines, line = [], ""
    for word in text.split(" "):
        if line and len(line) + 1 + len(word) > width:
            lines.append(line)
            line = word
        else:
            line = f"{line} {word}".strip()
    return lines + [line]


def main(argv: list[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    pairs = [a.split("=", 1) for a in args]
    if not pairs or any(len(p) != 2 for p in pairs):
        sys.exit("usage: python -m minitron.cli.views.svg_shapes TITLE=TRACE_DIR ...  (traces of "
                 "scripts/tp_pair_trace.py --keep DIR)")
    try:
        columns = [(title, load_trace(directory)[0]) for title, directory in pairs]
    except TraceError as exc:  # one line, as the command line says it
        sys.exit(str(exc))
    print(shapes_svg(columns), end="")


if __name__ == "__main__":
    main()
