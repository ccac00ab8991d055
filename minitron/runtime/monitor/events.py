"""What DeepSpeed's engine writes to its monitors and prints after each ``step()`` (the end of
``DeepSpeedEngine.step`` and its ``_write_monitor``), for minitron's engine.

At each optimizer step (a gradient-accumulation boundary), on rank 0: the first param group's lr
and, under fp16, the loss scale, at ``global_samples``. With wall_clock_breakdown, after every
micro-step the micro-step timers' line; at a boundary the step's five global timers go to the
monitors (before their line is printed, which resets them) and then their line.
"""

from __future__ import annotations


def step_events(engine) -> list:
    events = [("Train/Samples/lr", engine.get_lr()[0], engine.global_samples)]
    if engine._config.fp16_enabled:
        events.append(("Train/Samples/loss_scale", engine.optimizer.loss_scale, engine.global_samples))
    return events


def timer_events(engine) -> list:
    names = [("forward", "fwd"), ("backward", "bwd"), ("backward_inner", "bwd_inner"),
             ("backward_allreduce", "bwd_allreduce"), ("step", "step")]
    return [(f"Train/Samples/elapsed_time_ms_{tag}", engine.timers(timer).elapsed(reset=False), engine.global_samples)
            for tag, timer in names]


def report_step(engine, boundary: bool) -> None:
    """The monitors' events and the timers' lines after one ``engine.step()``."""
    if boundary and engine.monitor.enabled:
        engine.monitor.write_events(step_events(engine))
    if engine._config.wall_clock_breakdown:
        engine.timers.log(engine.engine_timers.micro_timers)
        if boundary:
            if engine.monitor.enabled:
                engine.monitor.write_events(timer_events(engine))
            engine.timers.log(engine.engine_timers.global_timers)
