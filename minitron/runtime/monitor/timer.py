"""``deepspeed/utils/timer.py``: the engine's wall-clock timers, which ``wall_clock_breakdown``
turns on and prints.

Ten timers, five phases each counted two ways: per micro-step (``fwd_microstep``, ...), printed
and reset at every ``engine.step()``, and per optimizer step (``fwd``, ``bwd``, ...), summed over
the step's micro-batches and printed and reset at its boundary. ``bwd`` spans ``bwd_inner`` (the
autograd backward) and ``bwd_allreduce`` (the gradient reduction after it; at ZeRO 2 most of the
reduction has already run inside backward, in the gradient hooks, so it counts as ``bwd_inner``).
A line reads, on rank 0 only:

    [Rank 0] time (ms) | fwd_microstep: 0.23 | bwd_microstep: 4.47 | ... | step_microstep: 7.27

DeepSpeed times a GPU with CUDA events (device time, no wait) and a CPU with ``time.time()``;
here a timer on a GPU waits for the device when it stops, so the host clock sees the device's
work too.
"""

from __future__ import annotations

import time

from minitron import comm as dist
from minitron.accelerator import get_accelerator

FORWARD_MICRO_TIMER, FORWARD_GLOBAL_TIMER = "fwd_microstep", "fwd"
BACKWARD_MICRO_TIMER, BACKWARD_GLOBAL_TIMER = "bwd_microstep", "bwd"
BACKWARD_INNER_MICRO_TIMER, BACKWARD_INNER_GLOBAL_TIMER = "bwd_inner_microstep", "bwd_inner"
BACKWARD_REDUCE_MICRO_TIMER, BACKWARD_REDUCE_GLOBAL_TIMER = "bwd_allreduce_microstep", "bwd_allreduce"
STEP_MICRO_TIMER, STEP_GLOBAL_TIMER = "step_microstep", "step"


class SynchronizedWallClockTimer:
    """Named timers, made on first use."""

    class Timer:
        def __init__(self, name: str):
            self.name_, self.started_, self.start_time, self.records = name, False, 0.0, []

        def start(self) -> None:
            assert not self.started_, f"{self.name_} timer has already been started"
            self.start_time, self.started_ = time.time(), True

        def stop(self) -> None:
            assert self.started_, "timer is not started"
            get_accelerator().synchronize()   # the device's queued work belongs to this interval
            self.records.append(time.time() - self.start_time)
            self.started_ = False

        def elapsed(self, reset: bool = True) -> float:
            """Milliseconds summed over the intervals since the last reset."""
            total = sum(self.records) * 1000.0
            if reset:
                self.records = []
            return total

    def __init__(self):
        self.timers: dict = {}

    def __call__(self, name: str) -> "SynchronizedWallClockTimer.Timer":
        if name not in self.timers:
            self.timers[name] = self.Timer(name)
        return self.timers[name]

    def log(self, names: list, reset: bool = True) -> None:
        """One line, printed by rank 0, of the named timers that have run."""
        line = "time (ms)" + "".join(f" | {name}: {self.timers[name].elapsed(reset=reset):.2f}"
                                     for name in names if name in self.timers)
        if dist.get_rank() == 0:
            print(f"[Rank 0] {line}", flush=True)


class EngineTimers:
    """Which timers each phase starts and stops; empty lists when wall_clock_breakdown is off, so
    the engine's calls cost nothing then."""

    PHASES = [(FORWARD_MICRO_TIMER, FORWARD_GLOBAL_TIMER), (BACKWARD_MICRO_TIMER, BACKWARD_GLOBAL_TIMER),
              (BACKWARD_INNER_MICRO_TIMER, BACKWARD_INNER_GLOBAL_TIMER),
              (BACKWARD_REDUCE_MICRO_TIMER, BACKWARD_REDUCE_GLOBAL_TIMER), (STEP_MICRO_TIMER, STEP_GLOBAL_TIMER)]

    def __init__(self, enabled: bool):
        phases = self.PHASES if enabled else []
        (self.forward_timers, self.backward_timers, self.backward_inner_timers, self.backward_reduce_timers,
         self.step_timers) = [list(pair) for pair in phases] or [[] for _ in self.PHASES]
        self.micro_timers = [micro for micro, _ in phases]
        self.global_timers = [whole for _, whole in phases]
