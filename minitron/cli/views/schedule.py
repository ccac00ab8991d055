"""The pipeline schedule as it executed: one row per stage.

Each forward_step / backward_step the schedules ran is a cell labelled F<micro-batch> or
B<micro-batch> (with a virtual pipeline, F3.1 is micro-batch 3 on model chunk 1). Two views:

* ``render_slots``: the textbook picture. Steps keep the order each stage executed them in,
  and each sits in the first time slot after both its predecessor on the same stage and the
  step it waits for on a neighbouring stage (the forward it receives, the backward whose
  gradient it receives). Empty slots are the pipeline bubble.
* ``render_timeline``: steps where they really happened in wall-clock time, with the idle
  fraction of each stage. On a shared CPU with a tiny model, communication and waiting for a
  core dominate, so this view is noisier than the first.
"""

from __future__ import annotations

from rich.text import Text

from minitron.cli.views.trace_dir import layout_args, world_size_of
from minitron.core.rank_generator import rank_coordinates

FORWARD = "minitron.core.pipeline_parallel.schedules.forward_step"
BACKWARD = "minitron.core.pipeline_parallel.schedules.backward_step"


def pipeline_steps(runs: dict[int, list[dict]], iteration: int | None = None) -> dict[int, list[dict]]:
    """pp stage -> its steps, for the pipeline of tensor rank 0 and data rank 0."""
    world = world_size_of(runs)
    sizes = layout_args(next(iter(runs.values())))
    stages = {}
    for rank, records in runs.items():
        c = rank_coordinates(rank, world, sizes["tp"], sizes["pp"], sizes["cp"], sizes["order"])
        if c["tp"] or c["dp"] or c["cp"]:
            continue
        steps = [r for r in records if r["name"] in (FORWARD, BACKWARD)]
        if iteration is not None:
            steps = [s for s in steps if _iteration_of(records, s) == iteration]
        stages[c["pp"]] = steps
    return dict(sorted(stages.items()))


def _iteration_of(records: list[dict], step: dict):
    by_id = {r["id"]: r for r in records}
    parent = step["parent"]
    while parent is not None:
        r = by_id[parent]
        if r["name"].endswith("training.train_step"):
            return r["args"].get("iteration")
        parent = r["parent"]
    return None


def _label(step: dict) -> str:
    kind = "F" if step["name"] == FORWARD else "B"
    chunk = step["args"].get("chunk")
    mb = step["args"].get("microbatch")
    return f"{kind}{mb}" + (f".{chunk}" if chunk is not None else "")


def _key(step: dict) -> tuple:
    return ("F" if step["name"] == FORWARD else "B", step["args"].get("microbatch"), step["args"].get("chunk"))


def assign_slots(stages: dict[int, list[dict]]) -> dict[int, list[tuple[int, dict]]]:
    """Place every step in the first slot its dependencies allow (see the module docstring)."""
    pp = len(stages)
    chunks = 1 + max((s["args"].get("chunk") or 0) for ss in stages.values() for s in ss)
    slot_of: dict[tuple, int] = {}  # (stage, kind, micro-batch, chunk) -> slot
    placed = {stage: [] for stage in stages}
    queue = sorted(((s["start_us"], stage, s) for stage, ss in stages.items() for s in ss), key=lambda x: x[0])
    pending = list(queue)
    while pending:  # dependencies first: repeat until every step found its slot
        progress = False
        for item in list(pending):
            _, stage, step = item
            kind, mb, chunk = _key(step)
            c = chunk or 0
            if kind == "F":  # waits for the same micro-batch one stage (or chunk) earlier
                dep = (stage - 1, "F", mb, chunk) if stage > 0 else ((pp - 1, "F", mb, c - 1) if c > 0 else None)
            elif stage < pp - 1:  # waits for the gradient from one stage later
                dep = (stage + 1, "B", mb, chunk)
            else:  # last stage: its own forward, or the next chunk's backward on stage 0
                dep = (0, "B", mb, c + 1) if c < chunks - 1 else (stage, "F", mb, chunk)
            if dep is not None and dep not in slot_of:
                continue
            previous = placed[stage][-1][0] if placed[stage] else -1
            slot = max(previous + 1, slot_of[dep] + 1 if dep is not None else 0)
            slot_of[(stage, kind, mb, chunk)] = slot
            placed[stage].append((slot, step))
            pending.remove(item)
            progress = True
        if not progress:
            raise ValueError("the steps' dependencies form a cycle: is this a complete iteration?")
    return placed


def render_slots(stages: dict[int, list[dict]]) -> Text:
    steps = [s for ss in stages.values() for s in ss]
    if not steps:
        return Text("no forward/backward steps in this trace (run with --steps 1 or more)", style="dim")
    placed = assign_slots(stages)
    width = max(len(_label(s)) for s in steps) + 1
    total = 1 + max(slot for row in placed.values() for slot, _ in row)
    out = Text()
    for stage, row in placed.items():
        cells = {slot: step for slot, step in row}
        out.append(f"stage {stage} ", style="bold")
        for slot in range(total):
            step = cells.get(slot)
            if step is None:
                out.append("·".ljust(width), style="dim")
            else:
                out.append(_label(step).ljust(width), style="bold blue" if step["name"] == FORWARD else "bold green")
        busy = len(row) / total
        out.append(f" bubble {1 - busy:4.0%}\n", style="yellow")
    out.append(f"        {total} slots; F = forward, B = backward, · = bubble (stage idle)", style="dim")
    return out


def render_timeline(stages: dict[int, list[dict]], width: int = 96) -> Text:
    steps = [s for ss in stages.values() for s in ss]
    if not steps:
        return Text("no forward/backward steps in this trace", style="dim")
    t0 = min(s["start_us"] for s in steps)
    t1 = max(s["end_us"] for s in steps)
    scale = width / max(t1 - t0, 1)
    out = Text()
    for stage, ss in stages.items():
        row = ["·"] * width
        styles = [None] * width
        busy = 0
        for s in ss:
            a = int((s["start_us"] - t0) * scale)
            b = max(a + 1, int((s["end_us"] - t0) * scale))
            busy += s["end_us"] - s["start_us"]
            label = _label(s).ljust(b - a, "-" if s["name"] == FORWARD else "=")[: b - a]
            for i, ch in enumerate(label):
                if a + i < width:
                    row[a + i] = ch
                    styles[a + i] = "bold blue" if s["name"] == FORWARD else "bold green"
        out.append(f"stage {stage} ", style="bold")
        for ch, style in zip(row, styles):
            out.append(ch, style=style or "dim")
        idle = 1 - busy / max(t1 - t0, 1)
        out.append(f"  idle {idle:4.0%}\n", style="yellow")
    out.append(f"        {(t1 - t0) / 1000:.1f} ms from the first forward to the last backward; "
               "F = forward, B = backward, · = not computing", style="dim")
    return out
