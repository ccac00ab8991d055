"""What DeepSpeed's engine writes to its monitors and prints after each ``step()`` (the end of
``DeepSpeedEngine.step`` and its ``_write_monitor``), for minitron's engine.

At each optimizer step (a gradient-accumulation boundary), on rank 0: the first param group's lr
and, under fp16, the loss scale, at ``global_samples``. With wall_clock_breakdown, after every
micro-step the micro-step timers' line; at a boundary the step's five global timers go to the
monitors (before their line is printed, which resets them) and then their line.
"""

from __future__ import annotations

from minitron import comm as dist
from minitron.runtime.monitor.monitor import MonitorMaster
from minitron.runtime.monitor.timer import EngineTimers, SynchronizedWallClockTimer
from minitron.runtime.profiling.flops_profiler import FlopsProfiler


def configure_monitoring(engine, config, mp_group) -> None:
    """The engine's monitors (rank 0 writes), its timers (named lists, empty unless
    wall_clock_breakdown), and its flops profiler, with DeepSpeed's attribute names."""
    engine.monitor = MonitorMaster(config.monitor_config)
    engine.timers, engine.engine_timers = SynchronizedWallClockTimer(), EngineTimers(config.wall_clock_breakdown)
    engine.world_size = dist.get_world_size()   # the profile's summary reports both sizes
    engine.mp_world_size = dist.get_world_size(group=mp_group) if mp_group is not None else 1
    settings = config.flops_profiler_config
    engine.flops_profiler = FlopsProfiler(engine.module, engine, settings["recompute_fwd_factor"]) \
        if settings["enabled"] else None


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


def report_step(engine, boundary: bool, profiling: bool = False) -> None:
    """The monitors' events, the flops profile (``profiling``: this step's forward was profiled)
    and the timers' lines after one ``engine.step()``. DeepSpeed prints the profile at every
    micro-step of the profiled step (the last forward's counts), labelled with the step count
    *after* the step, and before the timers' lines reset the timers its summary reads."""
    if boundary and engine.monitor.enabled:
        engine.monitor.write_events(step_events(engine))
    if profiling:
        settings = engine._config.flops_profiler_config
        engine.flops_profiler.print_model_profile(engine.global_steps, settings["module_depth"],
                                                  settings["top_modules"], settings["detailed"],
                                                  settings["output_file"])
        engine.flops_profiler.end_profile()
    if engine._config.wall_clock_breakdown:
        engine.timers.log(engine.engine_timers.micro_timers)
        if boundary:
            if engine.monitor.enabled:
                engine.monitor.write_events(timer_events(engine))
            engine.timers.log(engine.engine_timers.global_timers)
