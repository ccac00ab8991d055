"""DeepSpeed's pipeline stream as it executed, beside Megatron's 1F1B for the same layout.

The PipelineEngine (runtime/pipe/engine.py) records every instruction it executes with the
schedule step it belongs to. DeepSpeed's steps are lockstep units (a barrier could sit between
any two), so the natural picture is a grid: one row per stage, one column per step, each cell
the step's compute (F<micro-batch> or B<micro-batch>) or ``·`` when the stage only sends,
receives or waits. Megatron's 1F1B has no steps, only an order per stage; its picture is the
slot view of schedule.py, and ``megatron_1f1b_order`` writes down that order for any layout
from Megatron's own warm-up count, so the two can be compared even on a trace of one of them.
"""

from __future__ import annotations

from rich.text import Text

from minitron.cli.views.schedule import BACKWARD, FORWARD, first_pipeline, render_slots
from minitron.core.pipeline_parallel.pp_rank_microbatches import get_pp_rank_microbatches

PREFIX = "minitron.runtime.pipe.engine.PipelineEngine._exec_"
# The engine's method for each instruction, and how the stream names it (DeepSpeed's classes).
INSTRUCTIONS = {"load_micro_batch": "LoadMicroBatch", "forward_pass": "ForwardPass",
                "backward_pass": "BackwardPass", "send_activations": "SendActivation",
                "recv_activations": "RecvActivation", "send_grads": "SendGrad", "recv_grads": "RecvGrad",
                "reduce_tied_grads": "ReduceTiedGrads", "reduce_grads": "ReduceGrads",
                "optimizer_step": "OptimizerStep"}


def instruction_name(record: dict) -> str | None:
    """``ForwardPass`` for the engine's _exec_forward_pass record; None for any other record."""
    if not record["name"].startswith(PREFIX):
        return None
    return INSTRUCTIONS.get(record["name"][len(PREFIX):])


def deepspeed_streams(runs: dict[int, list[dict]], iteration: int | None = None,
                      schedule: str = "TrainSchedule") -> dict[int, list[dict]]:
    """pp stage -> its executed instructions (data rank 0, tensor rank 0), in order, of the last
    ``schedule`` batch, or of the ``iteration``-th when given (counted from the first the trace
    holds). An evaluation's batches are InferenceSchedule's."""
    streams = {}
    for stage, records in first_pipeline(runs).items():
        executed = [r for r in records if instruction_name(r) and r["args"].get("schedule") == schedule]
        batches, batch = [], []
        for r in executed:   # a new batch starts where the step count goes back to 0
            if batch and r["args"]["step"] < batch[-1]["args"]["step"]:
                batches.append(batch)
                batch = []
            batch.append(r)
        batches += [batch] if batch else []
        if batches:
            streams[stage] = batches[-1 if iteration is None else min(iteration, len(batches) - 1)]
    return streams


def _cell(step_records: list[dict]) -> tuple[str, str | None]:
    for r in step_records:
        name = instruction_name(r)
        if name in ("ForwardPass", "BackwardPass"):
            return f"{name[0]}{r['args']['microbatch']}", "bold blue" if name == "ForwardPass" else "bold green"
    return "·", None


def render_steps(streams: dict[int, list[dict]], width: int = 80) -> Text:
    """The step grid (see the module docstring), cut into bands that fit ``width``."""
    if not streams:
        return Text("no PipelineEngine instructions in this trace", style="dim")
    total = 1 + max(r["args"]["step"] for rs in streams.values() for r in rs)
    grid = {stage: [_cell([r for r in rs if r["args"]["step"] == s]) for s in range(total)]
            for stage, rs in streams.items()}
    cell = 1 + max(len(label) for row in grid.values() for label, _ in row)
    per_band = max(1, (width - len("stage 0 ")) // cell)
    out = Text()
    for band in range(0, total, per_band):
        if per_band < total:
            out.append(f"        steps {band}..{min(total, band + per_band) - 1}:\n", style="dim")
        for stage, row in grid.items():
            out.append(f"stage {stage} ", style="bold")
            for label, style in row[band:band + per_band]:
                out.append(label.ljust(cell), style=style or "dim")
            out.append("\n")
    out.append(f"        {total} steps = 2 x (micro-batches + stages - 1); F = ForwardPass, B = BackwardPass,\n"
               "        · = a step in which the stage only sends, receives or waits", style="dim")
    return out


def render_stream(records: list[dict]) -> Text:
    """One stage's stream, a line per step: DeepSpeed's instructions with their buffer ids."""
    out, steps = Text(), {}
    for r in records:
        steps.setdefault(r["args"]["step"], []).append(r)
    for step in range(1 + max(steps, default=-1)):   # the last step always steps the optimizer
        out.append(f"step {step:2d}  ", style="dim")
        names = [] if step in steps else ["(nothing)"]
        for r in steps.get(step, []):
            buffer_id = r["args"].get("buffer_id")
            names.append(instruction_name(r) + (f"({buffer_id})" if buffer_id is not None else "()"))
        out.append(" ".join(names) + "\n")
    return out


def megatron_1f1b_order(pp: int, num_microbatches: int) -> dict[int, list[dict]]:
    """Megatron's 1F1B as each stage runs it: the warm-up forwards its get_pp_rank_microbatches
    counts, then one forward and one backward at a time, then the remaining backwards. Written as
    schedule.py's step records (start_us = position), so render_slots can draw them."""
    stages = {}
    for rank in range(pp):
        _, _, warmup, remaining = get_pp_rank_microbatches(
            num_microbatches, 1, 1, pipeline_parallel_size=pp, pipeline_parallel_rank=rank)
        order = [(FORWARD, m) for m in range(warmup)]
        for i in range(remaining):
            order += [(FORWARD, warmup + i), (BACKWARD, i)]
        order += [(BACKWARD, m) for m in range(remaining, num_microbatches)]
        stages[rank] = [{"name": name, "args": {"microbatch": m}, "start_us": i} for i, (name, m) in enumerate(order)]
    return stages


def render_beside_1f1b(streams: dict[int, list[dict]], width: int = 80) -> Text:
    """The executed DeepSpeed grid, then Megatron's 1F1B for the same stages and micro-batches."""
    micro_batches = 1 + max(r["args"]["microbatch"] for rs in streams.values() for r in rs
                            if instruction_name(r) == "ForwardPass")
    out = Text()
    out.append("DeepSpeed TrainSchedule, as executed (one column per step):\n", style="bold")
    out.append_text(render_steps(streams, width))
    out.append(f"\nMegatron's 1F1B for the same {len(streams)} stages and {micro_batches} micro-batches "
               "(its order per stage; each step in the first slot it can run):\n", style="bold")
    out.append_text(render_slots(megatron_1f1b_order(len(streams), micro_batches), width))
    return out
