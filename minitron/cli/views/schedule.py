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

from minitron.trace.reader import layout_args, world_size_of
from minitron.core.group_layout import rank_coordinates

FORWARD = "minitron.core.pipeline_parallel.schedules.forward_step"
BACKWARD = "minitron.core.pipeline_parallel.schedules.backward_step"


def first_pipeline(runs: dict[int, list[dict]]) -> dict[int, list[dict]]:
    """pp stage -> its rank's records, for the pipeline of tensor, data and context rank 0."""
    world = world_size_of(runs)
    sizes = layout_args(next(iter(runs.values())))
    stages = {}
    for rank, records in runs.items():
        c = rank_coordinates(rank, world, sizes["tp"], sizes["pp"], sizes["cp"], sizes["order"])
        if not (c["tp"] or c["dp"] or c["cp"]):
            stages[c["pp"]] = records
    return dict(sorted(stages.items()))


def pipeline_steps(runs: dict[int, list[dict]], iteration: int | None = None) -> dict[int, list[dict]]:
    """pp stage -> its steps, for the pipeline of tensor rank 0 and data rank 0."""
    stages = {}
    for stage, records in first_pipeline(runs).items():
        steps = [r for r in records if r["name"] in (FORWARD, BACKWARD)]
        if iteration is not None:
            by_id = {r["id"]: r for r in records}
            steps = [s for s in steps if _iteration_of(by_id, s) == iteration]
        stages[stage] = steps
    return stages


def _iteration_of(by_id: dict, step: dict):
    """The iteration of the train_step that ``step`` ran inside, if any (a caller that never
    returned has no record: the chain ends there)."""
    caller = by_id.get(step["parent"])
    while caller is not None:
        if caller["name"].endswith("training.train_step"):
            return caller["args"].get("iteration")
        caller = by_id.get(caller["parent"])
    return None


def _label(step: dict) -> str:
    kind = "F" if step["name"] == FORWARD else "B"
    chunk = step["args"].get("chunk")
    mb = step["args"].get("microbatch")
    return f"{kind}{mb}" + (f".{chunk}" if chunk is not None else "")


def _key(step: dict) -> tuple:
    return ("F" if step["name"] == FORWARD else "B", step["args"].get("microbatch"), step["args"].get("chunk"))


def step_key(stage: int, step: dict) -> tuple:
    """(stage, F or B, micro-batch, chunk): a step's name in the dependency graph."""
    return (stage, *_key(step))


def dependency(stage: int, step: dict, pp: int, chunks: int) -> tuple | None:
    """The step on a neighbouring stage (or chunk) that ``step`` waits for, as a step_key: the
    forward whose activation it receives, or the backward whose gradient it receives."""
    kind, mb, chunk = _key(step)
    c = chunk or 0
    if kind == "F":  # waits for the same micro-batch one stage (or chunk) earlier
        return (stage - 1, "F", mb, chunk) if stage > 0 else ((pp - 1, "F", mb, c - 1) if c > 0 else None)
    if stage < pp - 1:  # waits for the gradient from one stage later
        return (stage + 1, "B", mb, chunk)
    # last stage: its own forward, or the next chunk's backward on stage 0
    return (0, "B", mb, c + 1) if c < chunks - 1 else (stage, "F", mb, chunk)


def in_dependency_order(stages: dict[int, list[dict]]):
    """Yield (stage, step, dependency) so that every step comes after its dependency and after
    its predecessor on the same stage; ValueError if the steps cannot be ordered so."""
    pp = len(stages)
    chunks = 1 + max((s["args"].get("chunk") or 0) for ss in stages.values() for s in ss)
    done: set[tuple] = set()
    pending = sorted(((s["start_us"], stage, s) for stage, ss in stages.items() for s in ss), key=lambda x: x[0])
    while pending:  # dependencies first: repeat until every step found its place
        progress = False
        for item in list(pending):
            _, stage, step = item
            dep = dependency(stage, step, pp, chunks)
            if dep is not None and dep not in done:
                continue
            done.add(step_key(stage, step))
            pending.remove(item)
            progress = True
            yield stage, step, dep
        if not progress:
            raise ValueError("the steps' dependencies form a cycle: is this a complete iteration?")


def assign_slots(stages: dict[int, list[dict]]) -> dict[int, list[tuple[int, dict]]]:
    """Place every step in the first slot its dependencies allow (see the module docstring)."""
    slot_of: dict[tuple, int] = {}  # step_key -> slot
    placed = {stage: [] for stage in stages}
    for stage, step, dep in in_dependency_order(stages):
        previous = placed[stage][-1][0] if placed[stage] else -1
        slot = max(previous + 1, slot_of[dep] + 1 if dep is not None else 0)
        slot_of[step_key(stage, step)] = slot
        placed[stage].append((slot, step))
    return placed


def render_slots(stages: dict[int, list[dict]], width: int = 80) -> Text:
    """The slot picture, at most ``width`` columns wide: a schedule too long for one line is cut
    into bands of slots, each band showing every stage, so no row ever wraps."""
    steps = [s for ss in stages.values() for s in ss]
    if not steps:
        return Text("no forward/backward steps in this trace (run with --steps 1 or more)", style="dim")
    placed = assign_slots(stages)
    cell = max(len(_label(s)) for s in steps) + 1
    total = 1 + max(slot for row in placed.values() for slot, _ in row)
    head, tail = "stage 0 ", "  100%"
    per_band = max(1, min(total, (width - len(head) - len(tail)) // cell))
    out = Text()
    for band in range(0, total, per_band):
        last_band = band + per_band >= total
        if per_band < total:
            out.append(f"        slots {band}..{min(total, band + per_band) - 1}:\n", style="dim")
        for stage, row in placed.items():
            cells = {slot: step for slot, step in row}
            out.append(f"stage {stage} ", style="bold")
            for slot in range(band, min(total, band + per_band)):
                step = cells.get(slot)
                if step is None:
                    out.append("·".ljust(cell), style="dim")
                else:
                    out.append(_label(step).ljust(cell), style="bold blue" if step["name"] == FORWARD else "bold green")
            if last_band:
                out.append(f" {1 - len(row) / total:4.0%}", style="yellow")
            out.append("\n")
    out.append(f"        {total} slots; F = forward, B = backward, · = bubble (stage idle);\n"
               "        at the right: the bubble, each stage's share of idle slots", style="dim")
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
