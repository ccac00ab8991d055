"""DeepSpeed's comms logger (``deepspeed/utils/comms_logging.py`` and ``timed_op`` in
``deepspeed/comm/comm.py``): every collective that passes through minitron.comm, timed, with its
message size, and a table of latency and bandwidth per operation and size.

What it measures, as DeepSpeed 0.19.8 measures it:
- the message size is the bytes of the tensor the rank hands in (``tensor``; for all_to_all_single,
  ``input``): an all_gather's input, not its gathered output; 0 for a barrier;
- the latency is wall-clock milliseconds around the call, after the accelerator is synchronised
  (a gloo CPU op has finished when it returns; an ``async_op`` one is timed as launched);
- the bandwidths are nccl-tests' algbw and busbw (calc_bw_log, below), in Gbps, with ``n`` the
  world size whatever group the op ran on.
One quirk is kept so the table reads as DeepSpeed's: DeepSpeed keeps one timer per log name and
reads it with ``elapsed(reset=False)``, which sums every interval the timer has seen, so the k-th
call of an op records the sum of the first k calls' durations (and its bandwidths shrink with k).
"""

from __future__ import annotations

import functools
import inspect
import math
import sys
import time

from minitron.accelerator import get_accelerator

SIZE_NAMES = ("B", "KB", "MB", "GB", "TB", "PB", "EB", "ZB", "YB")
ALL_TO_ALL = ("all_to_all_single", "all_to_all")
GATHERS = ("all_gather", "all_gather_into_tensor", "reduce_scatter", "reduce_scatter_tensor")
ALL_REDUCES = ("all_reduce", "all_reduce_coalesced", "inference_all_reduce")
ONE_WAY = ("send", "recv", "isend", "irecv", "batch_isend_irecv", "broadcast", "broadcast_object_list",
           "reduce", "gather", "scatter", "barrier")
COLUMNS = ("Comm. Op", "Message Size", "Count", "Total Latency(ms)", "Avg Latency(ms)", "tput_avg (Gbps)",
           "busbw_avg (Gbps)")


def convert_size(size_bytes: int) -> str:
    """Bytes in the largest 1024-power unit that leaves at least 1, rounded to 2 decimals ("1.5 KB")."""
    if size_bytes == 0:
        return "0B"   # DeepSpeed's spelling: no space, unlike every other size
    i = int(math.floor(math.log(size_bytes, 1024)))
    return f"{round(size_bytes / math.pow(1024, i), 2)} {SIZE_NAMES[i]}"


def calc_bw_log(comm_op: str, size: int, duration: float, world_size: int) -> tuple[float, float]:
    """(algbw, busbw) in Gbps of one op of ``size`` bytes that took ``duration`` ms on ``world_size`` ranks.

    algbw is the bytes the op moves for the caller over the time; busbw scales it by how much of
    that each link carries in a ring (nccl-tests' PERFORMANCE.md), so ops compare with each other
    and with the hardware's peak: an all-reduce sends and receives 2(n-1)/n of its buffer per rank,
    a gather or scatter (n-1)/n of the whole (n times the rank's input), point-to-point all of it.
    Bytes per ms times 8/1e6 is Gbps.
    """
    n = world_size
    if comm_op in ALL_TO_ALL:
        tput, busbw = size / duration, size / duration * ((n - 1) / n)
    elif comm_op in GATHERS:
        size *= n   # DeepSpeed's size is one rank's input: the op moves n of them
        tput, busbw = size / duration, size / duration * ((n - 1) / n)
    elif comm_op in ALL_REDUCES:
        tput, busbw = size * 2 / duration, size / duration * (2 * (n - 1) / n)
    elif comm_op in ONE_WAY:
        tput = busbw = size / duration
    else:   # DeepSpeed prints "wrong comm_op specified" and exits the process; one line here
        raise ValueError(f"comms logger: no bandwidth formula for {comm_op!r}; it knows "
                         f"{', '.join(ALL_TO_ALL + GATHERS + ALL_REDUCES + ONE_WAY)}")
    return tput * 8 / 1e6, busbw * 8 / 1e6


def trim_mean(data: list[float], trim_percent: float) -> float:
    """The mean without the lowest and highest ``round(n * trim_percent)`` values (DeepSpeed's
    utils/timer.py): one slow first call does not move the average."""
    n = len(data)
    if n == 0:
        return 0
    data, k = sorted(data), int(round(n * trim_percent))
    kept = data[k:n - k]
    return sum(kept) / len(kept)


class CommsLogger:
    """The records: ``comms_dict[log_name][msg_size] = [count, [latency ms], [algbw], [busbw]]``."""

    def __init__(self):
        self.comms_dict: dict = {}
        self.enabled, self.prof_all, self.prof_ops, self.verbose, self.debug = False, True, [], False, False
        self.world_size, self.rank = 1, 0
        self.elapsed: dict[str, float] = {}   # per log name: DeepSpeed's never-reset timer (module docstring)

    def configure(self, comms_config: dict) -> None:
        """From the ds_config's section (runtime/comm/comms_logger_config.py)."""
        for key in ("enabled", "prof_all", "prof_ops", "verbose", "debug"):
            setattr(self, key, comms_config[key])

    def profiles(self, name: str, prof: bool) -> bool:
        return self.enabled and (prof or self.prof_all or name in self.prof_ops)

    def append(self, raw_name: str, record_name: str, latency: float, msg_size: int) -> None:
        algbw, busbw = calc_bw_log(raw_name, msg_size, latency, self.world_size)
        count, latencies, algbws, busbws = self.comms_dict.setdefault(record_name, {}).setdefault(
            msg_size, [0, [], [], []])
        self.comms_dict[record_name][msg_size][0] = count + 1
        latencies.append(latency), algbws.append(algbw), busbws.append(busbw)
        if self.verbose and self.rank == 0:   # DeepSpeed's log_dist(..., ranks=[0])
            print(f"[Rank 0] comm op: {record_name} | time (ms): {latency:.2f} | msg size: "
                  f"{convert_size(msg_size)} | algbw (Gbps): {algbw:.2f} | busbw (Gbps): {busbw:.2f}", flush=True)

    def summary(self) -> dict:
        """Per op and size: count, total and trimmed-mean latency, trimmed-mean bandwidths."""
        return {name: {size: {"count": vals[0], "total_latency_ms": sum(vals[1]),
                              "avg_latency_ms": trim_mean(vals[1], 0.1), "tput_avg_gbps": trim_mean(vals[2], 0.1),
                              "busbw_avg_gbps": trim_mean(vals[3], 0.1), "msg_size_str": convert_size(size)}
                       for size, vals in sorted(sizes.items())}
                for name, sizes in self.comms_dict.items()}

    def table(self) -> list[str]:
        """DeepSpeed's log_all: a header of 20-wide columns, then each op's name on a line of its
        own and one line per message size under it."""
        lines = ["".join(f"{c: <20}" for c in COLUMNS)]
        for name, sizes in self.summary().items():
            lines.append(name)
            for row in sizes.values():
                lines.append(f"{' ': <20}{row['msg_size_str']: <20}{row['count']: <20}"
                             f"{row['total_latency_ms']: <20.2f}{row['avg_latency_ms']: <20.2f}"
                             f"{row['tput_avg_gbps']: <20.2f}{row['busbw_avg_gbps']: <20.2f}")
        return lines

    def log_all(self, print_log: bool = True) -> dict:
        if print_log:
            print("\n".join(self.table()), flush=True)
        return self.summary()


comms_logger = CommsLogger()


def msg_size(name: str, bound: dict) -> int:
    tensor = bound.get("input" if name == "all_to_all_single" else "tensor")
    return 0 if tensor is None else tensor.element_size() * tensor.nelement()


def timed_op(fn):
    """``fn`` timed into ``comms_logger`` when it is enabled (DeepSpeed's decorator of every
    collective). The wrapper takes DeepSpeed's ``prof`` (time this call even if its op is not
    profiled) and ``log_name`` (record it under another name) keywords."""
    signature = inspect.signature(fn)   # once: the wrapper binds each call's arguments by name

    @functools.wraps(fn)
    def log_wrapper(*args, prof: bool = False, log_name: str | None = None, **kwargs):
        log_name = log_name or fn.__name__
        if not comms_logger.profiles(log_name, prof):
            return fn(*args, **kwargs)
        if comms_logger.debug:   # the function that called the collective, as DeepSpeed's get_caller_func
            log_name += f" | [Caller Func: {sys._getframe(1).f_code.co_name}]"
        size = msg_size(fn.__name__, signature.bind(*args, **kwargs).arguments)
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            get_accelerator().synchronize()   # a device op has finished before the clock stops
            comms_logger.elapsed[log_name] = comms_logger.elapsed.get(log_name, 0.0) + \
                (time.perf_counter() - start) * 1000.0
            comms_logger.append(fn.__name__, log_name, comms_logger.elapsed[log_name], size)
    return log_wrapper
