"""Named wall-clock timers, called the way Megatron calls them: ``timers('forward').start()``.

Each timer has a log level; a timer above the run's ``--timing-log-level`` is a no-op, so
fine-grained timers can stay in the code at no cost. A GPU runs its kernels asynchronously:
the host returns from a step once the kernels are queued, so the clock alone would time the
launch, not the work. Like Megatron's, each timer therefore waits for the device before it
reads the clock, through the accelerator's ``synchronize()`` (a no-op on the CPU, where the
clock is already honest).
"""

from __future__ import annotations

import time

import torch

from minitron.accelerator import get_accelerator


class _Timer:
    def __init__(self, name: str):
        self.name = name
        self._elapsed = 0.0
        self._started_at = None

    def start(self, barrier: bool = False) -> None:
        assert self._started_at is None, f"timer {self.name} has already been started"
        if barrier:
            torch.distributed.barrier()
        get_accelerator().synchronize()   # the work queued before the start is not ours
        self._started_at = time.perf_counter()

    def stop(self, barrier: bool = False) -> None:
        assert self._started_at is not None, f"timer {self.name} is not started"
        if barrier:
            torch.distributed.barrier()
        get_accelerator().synchronize()   # the work we queued has finished, not just been launched
        self._elapsed += time.perf_counter() - self._started_at
        self._started_at = None

    def elapsed(self, reset: bool = True) -> float:
        running = self._started_at is not None
        if running:
            self.stop()
        value = self._elapsed
        if reset:
            self._elapsed = 0.0
        if running:
            self.start()
        return value


class _NullTimer:
    def start(self, barrier: bool = False) -> None:
        pass

    def stop(self, barrier: bool = False) -> None:
        pass

    def elapsed(self, reset: bool = True) -> float:
        return 0.0


class Timers:
    """``timers(name, log_level)`` returns the timer, creating it on first use."""

    def __init__(self, log_level: int = 0):
        self._log_level = log_level
        self._timers: dict[str, _Timer] = {}
        self._null = _NullTimer()

    def __call__(self, name: str, log_level: int = 0):
        if log_level > self._log_level:
            return self._null
        return self._timers.setdefault(name, _Timer(name))

    def elapsed_ms(self, names, reset: bool = True) -> dict[str, float]:
        return {n: self._timers[n].elapsed(reset) * 1000.0 for n in names if n in self._timers}

    def log(self, names, normalizer: float = 1.0, reset: bool = True) -> str:
        """One line 'name: ms | ...'; the caller decides which rank prints it."""
        times = self.elapsed_ms(names, reset)
        return " | ".join(f"{n}: {ms / normalizer:.2f} ms" for n, ms in times.items())
