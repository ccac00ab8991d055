"""Pipeline schedules as timelines: one row per stage, a box per forward and backward step.

Each box is as long as the step really took: its duration is read from the trace
(``forward_step`` / ``backward_step`` records, tensor rank 0, data rank 0). Where the boxes
stand depends on the mode:

* ``replay`` (the default): every stage starts a step as soon as it is free and the step's input
  has arrived (the activation from the stage before, or the gradient from the stage after;
  schedule.dependency), with communication counted as instant. This is the executed order on
  the measured compute times, what a machine with fast links would show; on a shared CPU, where
  ranks wait for a core and for gloo, the wall clock hides the schedule under that waiting.
* ``unit``: as ``replay``, but on the textbook's times instead of measured ones: a forward costs
  one unit, a backward two (it computes the gradients of the inputs and of the weights), and
  with ``v`` chunks per stage each step is ``1/v`` of that. On a busy machine a measured step
  includes whatever the rank waited for inside it (a core, a collective), and those accidents
  can draw a bubble the schedule does not have; unit times show the schedule alone.
* ``wall``: where the steps really happened on the wall clock, waiting included.

Empty stretches of a row are the bubble; at its right each row gives the stage's idle share and
the peak number of micro-batches *in flight* on it: forwards run whose backward has not yet run,
each holding its activations, counted along the stage's executed order. Several schedules drawn
together share one time scale, so their lengths and bubbles compare directly.
"""

from __future__ import annotations

import sys

from minitron.cli.views import svg
from minitron.cli.views.schedule import FORWARD, in_dependency_order, pipeline_steps, step_key
from minitron.trace.reader import TraceError, iterations, load_trace

# The picture fills the page's column (svg.COLUMN): the rows' names at the left, the idle share
# and the peak at the right, and between them the time axis, wide enough that the boxes of an
# interleaved schedule (each 1/v of a step) still hold their micro-batch's number in svg.TEXT.
ROW_H, ROW_GAP = 22, 4
LABEL_W = svg.text_width("stage 00 ", svg.TEXT)
PEAK_X = svg.text_width(" 100% ", svg.TEXT)   # the peak's column, after the idle share's
RIGHT_W = 8 + svg.text_width("idle  peak in flight ", svg.TEXT)
PLOT_W = svg.COLUMN - LABEL_W - RIGHT_W
FWD, BWD = ("#4e79a7", "#a0cbe8"), ("#59a14f", "#8cd17d")  # chunk 0, chunk 1+ (lighter)


def durations_us(step: dict) -> float:
    return step["end_us"] - step["start_us"]


UNIT = 1000.0  # one unit of ``unit`` mode, in the µs the rest of the code measures in
MODES = ("replay", "unit", "wall")


def unit_us(step: dict, chunks: int) -> float:
    """A step's length in ``unit`` mode: forward 1, backward 2, divided among the chunks."""
    return (1 if step["name"] == FORWARD else 2) * UNIT / chunks


def place(stages: dict[int, list[dict]], mode: str = "replay") -> dict[int, list[tuple[float, float, dict]]]:
    """stage -> [(start, end, step)] in µs from the schedule's first step."""
    if mode == "wall":
        t0 = min(s["start_us"] for ss in stages.values() for s in ss)
        return {stage: [(s["start_us"] - t0, s["end_us"] - t0, s) for s in ss] for stage, ss in stages.items()}
    if mode not in MODES:
        raise ValueError(f"unknown timeline mode {mode!r}: {', '.join(MODES)}")
    chunks = 1 + max((s["args"].get("chunk") or 0) for ss in stages.values() for s in ss)
    length = durations_us if mode == "replay" else lambda step: unit_us(step, chunks)
    end_of: dict[tuple, float] = {}
    placed: dict[int, list] = {stage: [] for stage in stages}
    for stage, step, dep in in_dependency_order(stages):
        free = placed[stage][-1][1] if placed[stage] else 0.0
        start = max(free, end_of[dep] if dep is not None else 0.0)
        end = start + length(step)
        end_of[step_key(stage, step)] = end
        placed[stage].append((start, end, step))
    return placed


def peak_in_flight(steps: list[dict]) -> int:
    """The most forwards whose backward had not yet run, along one stage's executed order."""
    held = peak = 0
    for step in sorted(steps, key=lambda s: s["start_us"]):
        held += 1 if step["name"] == FORWARD else -1
        peak = max(peak, held)
    return peak


def timeline_svg(schedules: list[tuple[str, dict[int, list[dict]]]], mode: str = "replay") -> str:
    """One picture of several schedules (title, stage -> steps), on one time scale."""
    placed = [(name, stages, place(stages, mode)) for name, stages in schedules]
    span = max(end for _, _, p in placed for row in p.values() for _, end, _ in row)
    scale = PLOT_W / span
    parts, y = [], 0.0
    for name, stages, rows in placed:
        length = max(end for row in rows.values() for _, end, _ in row)
        parts.append(svg.text(0, y + 15, name, size=svg.LABEL, font_weight="bold"))
        parts.append(svg.text(LABEL_W + PLOT_W, y + 15, _time(length, mode), anchor="end", opacity="0.75"))
        parts.append(svg.text(LABEL_W + PLOT_W + 8, y + 15, "idle  peak in flight", opacity="0.75"))
        y += 24
        for stage, row in rows.items():
            parts.append(_row(stage, row, y, scale, length, mode))
            y += ROW_H + ROW_GAP
        y += 12
    chunks = {step["args"].get("chunk") for _, stages, _ in placed for ss in stages.values() for step in ss}
    parts.append(_legend(y, chunks - {None}))
    y += 22
    if mode == "unit":  # say what the lengths are, on the picture itself
        parts.append(svg.text(LABEL_W, y + 14, "unit times, not measured: forward 1, backward 2, each "
                              "divided by the chunks per stage", opacity="0.75"))
        y += 22
    label = "pipeline schedules: " + ", ".join(name for name, _ in schedules)
    return svg.document(LABEL_W + PLOT_W + RIGHT_W, y, parts, label)


def _time(us: float, mode: str) -> str:
    return f"{us / UNIT:g} units" if mode == "unit" else f"{us / 1000:.1f} ms"


def _row(stage: int, row: list[tuple[float, float, dict]], y: float, scale: float, length: float, mode: str) -> str:
    busy = sum(end - start for start, end, _ in row)
    out = [f'<g data-stage="{stage}">',
           svg.text(0, y + ROW_H * 0.72, f"stage {stage}"),
           svg.rect(LABEL_W, y, length * scale, ROW_H, "currentColor", opacity="0.07")]
    for start, end, step in row:
        out.append(_box(stage, start, end, step, y, scale, mode))
    out.append(svg.text(LABEL_W + PLOT_W + 8, y + ROW_H * 0.72, f"{1 - busy / length:4.0%}"))
    out.append(svg.text(LABEL_W + PLOT_W + 8 + PEAK_X, y + ROW_H * 0.72, str(peak_in_flight([s for _, _, s in row])),
                        font_weight="bold"))
    out.append("</g>")
    return "\n".join(out)


def _box(stage: int, start: float, end: float, step: dict, y: float, scale: float, mode: str) -> str:
    forward = step["name"] == FORWARD
    mb, chunk = step["args"].get("microbatch"), step["args"].get("chunk")
    fill = (FWD if forward else BWD)[1 if chunk else 0]
    kind = "F" if forward else "B"
    name = f"{kind}{mb}" + (f".{chunk}" if chunk is not None else "")
    x, w = LABEL_W + start * scale, max((end - start) * scale, 0.8)
    tip = f"stage {stage}: {name}, " + (_time(end - start, mode) if mode == "unit" else f"{(end - start) / 1000:.2f} ms")
    parts = [svg.title(tip), svg.rect(x, y, w, ROW_H, fill, stroke="#ffffff", stroke_width="0.5")]
    # the number where the box holds it with a pixel either side, else only in the tooltip
    if mb is not None and w >= svg.text_width(str(mb), svg.TEXT) + 2:
        parts.append(svg.text(x + w / 2, y + ROW_H * 0.72, str(mb), anchor="middle", fill=svg.INK))
    return (f'<g data-step="{kind}" data-microbatch="{mb}" data-chunk="{"" if chunk is None else chunk}" '
            f'data-us="{end - start:.0f}">' + "".join(parts) + "</g>")


def _legend(y: float, chunks: set[int]) -> str:
    """The fills the picture uses, and no other (``chunks``: the model chunks of its interleaved
    schedules): the lighter ones, chunk 1 and later, only where an interleaved schedule is
    drawn. The legend once listed "chunk 1" under a plain 1F1B schedule too."""
    first = ", chunk 0" if chunks else ""
    later = f"chunk {max(chunks)}" if len(chunks) == 2 else f"chunks 1-{max(chunks, default=0)}"
    items = [(FWD[0], "forward" + first), (BWD[0], "backward" + first)]
    if len(chunks) > 1:
        items += [(FWD[1], f"forward, {later}"), (BWD[1], f"backward, {later}")]
    out, x = [], 0.0
    for fill, name in items:
        out.append(svg.rect(x, y + 4, 12, 12, fill))
        out.append(svg.text(x + 16, y + 15, name))
        x += 16 + svg.text_width(name, svg.TEXT) + 16
    out.append(svg.text(x, y + 15, "numbers: micro-batch", opacity="0.75"))
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    """``python -m minitron.cli.views.svg_timeline [--wall | --unit] NAME=DIR ...``: print the
    schedules of the last traced iteration in each DIR as one picture."""
    args = list(sys.argv[1:] if argv is None else argv)
    flags = {"--wall": "wall", "--unit": "unit"}
    mode = next((flags[a] for a in args if a in flags), "replay")
    pairs = [a.split("=", 1) for a in args if a not in flags]
    if not pairs or any(len(p) != 2 for p in pairs):
        sys.exit("usage: python -m minitron.cli.views.svg_timeline [--wall | --unit] NAME=TRACE_DIR ...")
    schedules = []
    for name, directory in pairs:
        try:
            runs = load_trace(directory)
        except TraceError as exc:  # one line, as the command line says it
            sys.exit(str(exc))
        done = iterations(runs)
        if not done:
            sys.exit(f"{directory} holds no training iteration (trace one with --steps 1)")
        schedules.append((name, pipeline_steps(runs, iteration=done[-1])))
    print(timeline_svg(schedules, mode), end="")


if __name__ == "__main__":
    main()
