"""Read a trace directory back, checked: ``rank{R}.jsonl`` per rank, one record per finished call
(the format: trace/schema.py).

Whoever wrote it — `minitron trace`, `launch --trace`, `pretrain --trace`, or torchrun with
MINITRON_TRACE_DIR set — the files are the same, and so is everything read from them here: the
world size, the layout initialize_model_parallel was called with, the backend, the iterations.

This is the one place that reads those files, and it hands the views nothing they could trip
on: every record has its fields with their types, finite times that do not run backwards,
an id of its own, a caller that began before it (so the calls form trees, of bounded depth),
and a rank inside the world (of a fake play that chose its ranks, `trace --ranks`, one of those:
such a partial trace says which ranks it holds, and holds just those). The first record that breaks a rule stops the reading with a
TraceError naming ``FILE:LINE`` and what is wrong. Reading is bounded: one line at a time, each
at most schema.MAX_LINE_BYTES, so a file that never ends (a link to /dev/zero) is refused, not
read forever, and memory grows with the trace, not with what a line claims.

A call that may block is also written as it begins, as an open record in
``entered/rank{R}.jsonl`` (schema.OPEN); ``read_in_flight`` pairs those with the finished records,
and hands over the ones left unpaired: the calls in flight when the rank stopped (trace/hang.py
reads a hung job with it). ``read_trace`` reads the finished calls alone, as the views show them.

Two things a real run leaves are not errors. A rank that was killed can leave its last line cut
in half (the recorder writes in 64 KiB blocks): a last line without its newline that does not
parse is skipped and counted. And the calls it had open never wrote a record, so a record's
parent may be missing: the views show such a call as one whose caller never returned.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

from minitron.trace.group_ranks import expand_group
from minitron.trace.schema import (
    CLOCK, ENTERED_DIR, GPU_TIME, HOST_TIME, MAX_LINE_BYTES, MAX_WORLD, OPEN, PLAYED, RANK_FILE,
)
from minitron.trace.validate import depth_problem, link_problem, record_problem, unreadable

INIT_MP = "minitron.core.parallel_state.initialize_model_parallel"
INIT_PG = "torch.distributed.init_process_group"
TRAIN_STEP = "minitron.training.training.train_step"
RECORD_ONE = ("record one with `minitron trace --out DIR`, `pretrain --trace DIR`, or "
              "MINITRON_TRACE_DIR=DIR under torchrun")


class TraceError(ValueError):
    """A trace directory, or a line of one of its files, cannot be read as a trace."""


def rank_files(trace_dir: str | Path) -> dict[int, Path]:
    files = {}
    for path in Path(trace_dir).glob("rank*.jsonl"):
        match = RANK_FILE.fullmatch(path.name)
        if match:
            files[int(match.group(1))] = path
    return dict(sorted(files.items()))


def read_rank(path: Path, rank: int | None = None) -> tuple[list[dict], bool]:
    """A rank's records ordered by start time (parents before children), and whether its
    last line was cut short."""
    records, cut, _ = _read_rank(Path(path), _rank_of(Path(path)) if rank is None else rank)
    return records, cut


# A check of the records as a whole that a floor above adds (the views check the recorded layout
# with the rank arithmetic, which lives above this floor): the first bad record, as (rank,
# record, what is wrong), or None. The reader knows the lines, so it names them.
Check = Callable[[dict], Optional[tuple]]


def read_trace(trace_dir: str | Path, check: Check | None = None) -> tuple[dict[int, list[dict]], list[int]]:
    """rank -> its records ordered by start time, and the ranks whose last line was cut."""
    runs, cut, _ = _read_dir(trace_dir, check, in_flight=False)
    return runs, cut


def read_in_flight(trace_dir: str | Path) -> tuple[dict[int, list[dict]], list[int], dict[int, list[dict]]]:
    """As read_trace, and rank -> the open records of the calls it never finished (outermost
    first). A rank whose file holds only such calls is no error here: it hung in its first."""
    return _read_dir(trace_dir, None, in_flight=True)


def _read_dir(trace_dir, check: Check | None, in_flight: bool):
    trace_dir = Path(trace_dir)
    if not trace_dir.is_dir():
        why = "it is not a directory" if trace_dir.exists() else "it does not exist"
        raise TraceError(f"{trace_dir} holds no rank*.jsonl files: {why} (give the directory the ranks traced into)")
    files = rank_files(trace_dir)
    if not files:
        raise TraceError(f"{trace_dir} holds no rank*.jsonl files: nothing was traced there ({RECORD_ONE})")
    runs, cut, lines, opened = {}, [], {}, {}
    for rank, path in files.items():
        entered = path.parent / ENTERED_DIR / path.name
        opened[rank] = _read_entered(entered, rank) if in_flight and entered.is_file() else {}
        runs[rank], was_cut, lines[rank] = _read_rank(path, rank, entered.is_file(), bool(opened[rank]))
        if was_cut:
            cut.append(rank)
        opened[rank] = _unpaired(opened[rank], runs[rank], entered)
    _check_world(runs, files, lines)
    found = check(runs) if check else None
    if found:
        rank, record, problem = found
        raise _bad(files[rank], lines[rank][record["id"]], problem)
    return runs, cut, opened


def load_trace(trace_dir: str | Path, check: Check | None = None) -> dict[int, list[dict]]:
    """rank -> its records, ordered by start time."""
    return read_trace(trace_dir, check)[0]


def in_trace_order(records: list[dict]) -> list[dict]:
    """Records by start time, parents before children (a file holds them as calls ended)."""
    return sorted(records, key=lambda r: (r["start_us"], r["id"]))


def _rank_of(path: Path) -> int:
    match = RANK_FILE.fullmatch(path.name)
    if not match:
        raise TraceError(f"{path}: not a rank's trace file (those are named rank<R>.jsonl)")
    return int(match.group(1))


def _read_rank(path: Path, rank: int, entered: bool = False, opened: bool = False) -> tuple[list[dict], bool, dict[int, int]]:
    """The checked records of one file, whether its last line was cut, and each id's line.
    ``entered``: the rank wrote open records, so an empty file is a rank that hung in its first
    call; ``opened``: those records (read_in_flight), with which an empty file is no error."""
    if not path.is_file():   # a directory, a device, a pipe: nothing a recorder leaves
        kind = "a directory" if path.is_dir() else "not a regular file"
        raise TraceError(f"{path}: is {kind}, not a rank's trace; remove it or trace the run again")
    records, line_of, cut, number = [], {}, False, 0
    try:
        f = open(path, "rb")
    except OSError as exc:
        raise TraceError(f"{path}: cannot be read ({exc.strerror})") from None
    with f:
        while True:
            line = f.readline(MAX_LINE_BYTES + 1)
            if not line:
                break
            number += 1
            if len(line) > MAX_LINE_BYTES:
                raise _bad(path, number, f"is longer than {MAX_LINE_BYTES >> 20} MiB, which no record is")
            if not line.strip():
                continue
            try:
                record = json.loads(line.decode("utf-8"))
            except (ValueError, RecursionError) as exc:   # UnicodeDecodeError is a ValueError
                if not line.endswith(b"\n"):   # only the last line lacks it: cut mid-write
                    cut = True
                    break
                raise _bad(path, number, unreadable(exc)) from None
            problem = (expand_group(record, MAX_WORLD)   # first: the checks below see the list
                       or record_problem(record, rank, line.count(b"[") + line.count(b"{"))
                       or link_problem(record, line_of))
            if problem:
                raise _bad(path, number, problem)
            line_of[record["id"]] = number
            records.append(record)
    if not records and not opened:
        raise _bad(path, 1, ("holds only a line cut short" if cut else "is empty") + ": a rank writes a record "
                   "as each call ends, so it stopped before any did",
                   f"it hung or was stopped in its first call: `minitron view {path.parent} --hang` shows where"
                   if entered else "trace the run again, or remove the file")
    too_deep = depth_problem(records)
    if too_deep:
        raise _bad(path, line_of[too_deep[0]], too_deep[1])
    return in_trace_order(records), cut, line_of


def _read_entered(path: Path, rank: int) -> dict[int, dict]:
    """id -> open record, from a rank's entered/ file (checked as its records are)."""
    opened: dict[int, dict] = {}
    with open(path, "rb") as f:
        for number, line in enumerate(iter(lambda: f.readline(MAX_LINE_BYTES + 1), b""), 1):
            if len(line) > MAX_LINE_BYTES:
                raise _bad(path, number, f"is longer than {MAX_LINE_BYTES >> 20} MiB, which no record is")
            try:
                record = json.loads(line.decode("utf-8"))
            except (ValueError, RecursionError) as exc:
                if not line.endswith(b"\n"):   # cut mid-write by a kill: the last line only
                    break
                raise _bad(path, number, unreadable(exc)) from None
            problem = (("is not an open record (it has no \"open\": true)" if type(record) is not dict
                        or record.get(OPEN) is not True else None)
                       or expand_group(record, MAX_WORLD)
                       or record_problem({**record, "end_us": record.get("start_us")}, rank,
                                         line.count(b"[") + line.count(b"{"))
                       or link_problem(record, {i: 0 for i in opened}))
            if problem:
                raise _bad(path, number, problem.replace("line 0", "an earlier line"))
            opened[record["id"]] = record
    return opened


def _unpaired(opened: dict[int, dict], records: list[dict], path: Path) -> list[dict]:
    """The open records no finished record pairs with, outermost first: the calls in flight. A
    finished call's record must tell the same call (name, start) as its open one."""
    finished = {r["id"]: r for r in records}
    for call_id, o in opened.items():
        r = finished.get(call_id)
        if r is not None and (r["name"], r["start_us"], r["pid"]) != (o["name"], o["start_us"], o["pid"]):
            raise TraceError(f"{path}: call {call_id} is {o['name']} here and {r['name']} in its rank's file; "
                             f"these files are of different runs: trace the run again")
    return sorted((o for i, o in opened.items() if i not in finished), key=lambda r: r["id"])


def _bad(path: Path, number: int, problem: str,
         fix: str = "not a record minitron's recorder wrote: trace the run again") -> TraceError:
    return TraceError(f"{path}:{number}: {problem}; {fix}")


def _check_world(runs: dict[int, list[dict]], files: dict[int, Path], lines: dict[int, dict]) -> None:
    """Every rank's init_process_group (and fake play) names the same world, every file's rank is
    inside it, and a fake play that chose its ranks holds exactly the files of those ranks."""
    world, where, played = None, None, None
    for rank, records in runs.items():
        for r in records:
            size = r["args"].get("world_size") if r["name"] in (INIT_PG, PLAYED) else None
            if size is None or size == -1:   # -1: the world came from the environment, unrecorded
                continue
            here = f"{files[rank]}:{lines[rank][r['id']]}"
            if world is None:
                world, where = size, here
            elif size != world:
                raise TraceError(f"{here}: world_size {size} disagrees with world_size {world} at {where}; "
                                 f"these files are of different runs: keep one run per directory")
            if r["name"] == PLAYED:
                if played is not None and r["args"]["ranks"] != played[0]:
                    raise TraceError(f"{here}: the ranks played differ from those at {played[1]}; these files "
                                     f"are of different runs: keep one run per directory")
                played = (r["args"]["ranks"], here)
    outside = [rank for rank in runs if rank >= (world or MAX_WORLD)]
    if outside and world is None:
        raise TraceError(f"{files[outside[0]]}:1: rank {outside[0]} is beyond the {MAX_WORLD} ranks a trace "
                         f"may hold; not a file minitron's recorder wrote")
    if outside:
        raise TraceError(f"{files[outside[0]]}:1: rank {outside[0]} is outside the world of {world} ranks "
                         f"that {where} records; keep one run per directory")
    if played is not None and played[0] != "all":
        _check_played(runs, files, played[0], played[1], world)


def _check_played(runs: dict, files: dict[int, Path], ranks: list[int], where: str, world: int) -> None:
    """A partial trace (`trace --ranks`) holds the files of the ranks it says it played, no other."""
    if ranks[-1] >= world:
        raise TraceError(f"{where}: rank {ranks[-1]} was played, outside the world of {world} ranks; "
                         f"not a record minitron's recorder wrote")
    chosen = set(ranks)
    stray = [rank for rank in runs if rank not in chosen]
    if stray:
        raise TraceError(f"{files[stray[0]]}:1: rank {stray[0]} is not one of the ranks played ({where}); "
                         f"keep one run per directory")
    missing = [rank for rank in ranks if rank not in runs]
    if missing:
        raise TraceError(f"{where}: rank {missing[0]} was played, but the directory holds no rank{missing[0]}.jsonl; "
                         f"trace the run again")


def layout_args(records: list[dict]) -> dict | None:
    """The sizes initialize_model_parallel was called with, read from its own trace record."""
    for r in records:
        if r["name"] == INIT_MP:
            a = r["args"]
            return {"tp": a.get("tensor_model_parallel_size", 1), "pp": a.get("pipeline_model_parallel_size", 1),
                    "cp": a.get("context_parallel_size", 1), "ep": a.get("expert_model_parallel_size", 1),
                    "order": a.get("order", "tp-cp-ep-dp-pp"),
                    "expert_tp": a.get("expert_tensor_parallel_size")}   # None: tp's, Megatron's default
    return None


def _init_arg(runs: dict[int, list[dict]], key: str):
    return next((r["args"][key] for records in runs.values() for r in records
                 if r["name"] == INIT_PG and r["args"].get(key) not in (None, -1)), None)


def played_ranks(runs: dict[int, list[dict]]) -> list[int] | None:
    """The ranks a fake play chose (`trace --ranks`), or None: every rank was played, or the
    trace is not a fake play."""
    played = next((r["args"]["ranks"] for records in runs.values() for r in reversed(records)
                   if r["name"] == PLAYED), "all")
    return None if played == "all" else played


def world_size_of(runs: dict[int, list[dict]]) -> int:
    """The world init_process_group recorded; without one, the least world the files fit in."""
    return _init_arg(runs, "world_size") or max(len(runs), max(runs, default=-1) + 1)


def backend_of(runs: dict[int, list[dict]]) -> str | None:
    """The backend init_process_group was given ("gloo", "nccl", "fake"), if the trace has it."""
    return _init_arg(runs, "backend")


def iterations(runs: dict[int, list[dict]]) -> list[int]:
    """The training iterations (train_step's ``iteration``) that any rank recorded."""
    return sorted({r["args"]["iteration"] for records in runs.values() for r in records
                   if r["name"] == TRAIN_STEP and "iteration" in r["args"]})


def clock_of(runs: dict[int, list[dict]]) -> str:
    """Which clock the times read: GPU time where a recorder waited for the device (it wrote
    schema.CLOCK), host time otherwise: every CPU run, and every trace older than that record."""
    synced = any(r["name"] == CLOCK for records in runs.values() for r in records)
    return GPU_TIME if synced else HOST_TIME
