"""The engine's logger and its memory lines: DeepSpeed's ``utils/logging.py`` (``logger``,
``print_configuration``) and ``runtime/utils.py`` (``see_memory_usage``), small.

``logger`` is what the ds_config's ``log_level`` sets (DeepSpeed's default level is INFO); it
carries ``dump_state``'s lines and the config's warnings. ``see_memory_usage`` is what
``memory_breakdown`` turns on: DeepSpeed prints it on rank 0 around forward, backward and step.
On a CPU rank DeepSpeed's accelerator answers "allocated" and "reserved" with the process's
resident set (psutil's RSS), and its peak with the largest RSS it has sampled since the last
reset; here the same numbers come from /proc, which needs no psutil.
"""

from __future__ import annotations

import gc
import logging
import os
import sys

import torch

from minitron import comm as dist

logger = logging.getLogger("minitron.runtime")
if not logger.handlers:   # DeepSpeed's logger: its own stdout handler, INFO, not passed up to the root's
    _handler = logging.StreamHandler(sys.stdout)
    _handler.setFormatter(logging.Formatter("[%(asctime)s] [%(levelname)s] [%(filename)s:%(lineno)d:%(funcName)s] "
                                            "%(message)s"))
    logger.addHandler(_handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False


def set_log_level(level: int) -> None:
    """The logger's level and its handlers' (DeepSpeed's set_log_level_from_string)."""
    logger.setLevel(level)
    for handler in logger.handlers:
        handler.setLevel(level)


def print_configuration(obj, name: str) -> None:
    """Every attribute of ``obj``, sorted, one line each, padded with dots (``dump_state``)."""
    logger.info(f"{name}:")
    for attr in sorted(vars(obj)):
        logger.info(f"  {attr} {'.' * (29 - len(attr))} {getattr(obj, attr)}")


_peak_rss = 0


def _rss() -> int:
    """This process's resident set in bytes (what DeepSpeed's CPU accelerator calls allocated)."""
    global _peak_rss
    try:
        with open("/proc/self/statm") as f:
            rss = int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):   # not Linux: the kernel's peak is all there is
        import resource   # lazy: only where /proc is missing
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    _peak_rss = max(_peak_rss, rss)
    return rss


def _host_used() -> tuple[float, float]:
    """The machine's memory in use (total minus available), in GB and percent, as psutil reports it."""
    try:
        with open("/proc/meminfo") as f:
            info = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
        used = info["MemTotal"] - info["MemAvailable"]
        return round(used / 1024**3, 2), round(100.0 * used / info["MemTotal"], 1)
    except (OSError, KeyError, ValueError):
        return 0.0, 0.0


def see_memory_usage(message: str, force: bool = False) -> None:
    """Rank 0 prints ``message``, then the device's allocated/peak/reserved memory and the host's
    memory in use. Collects Python's garbage first, so the numbers are not last step's leftovers."""
    global _peak_rss
    if not force or (dist.is_initialized() and dist.get_rank() != 0):
        return
    gc.collect()
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        now, peak = torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated()
        cached, max_cached = torch.cuda.memory_reserved(), torch.cuda.max_memory_reserved()
        torch.cuda.reset_peak_memory_stats()
    else:
        now = cached = _rss()
        peak = max_cached = _peak_rss
        _peak_rss = 0   # DeepSpeed's reset_peak_memory_stats: the next peak is the next call's
    gb = 1024**3
    print(message)
    print(f"MA {round(now / gb, 2)} GB         Max_MA {round(peak / gb, 2)} GB         CA {round(cached / gb, 2)} GB"
          f"         Max_CA {round(max_cached / gb)} GB ")
    used, percent = _host_used()
    print(f"CPU Virtual Memory:  used = {used} GB, percent = {percent}%", flush=True)
