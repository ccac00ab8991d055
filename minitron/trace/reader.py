"""Read a trace directory back: ``rank{R}.jsonl`` per rank, one JSON object per finished call.

Whoever wrote it — `minitron trace`, `launch --trace`, `pretrain --trace`, or torchrun with
MINITRON_TRACE_DIR set — the files are the same, and so is everything read from them here: the
world size, the layout initialize_model_parallel was called with, the backend, the iterations.

A rank that was killed can leave its last line cut in half (the recorder writes in 64 KiB
blocks); that line is skipped and counted, so the rest of the rank can still be read.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

INIT_MP = "minitron.core.parallel_state.initialize_model_parallel"
INIT_PG = "torch.distributed.init_process_group"
TRAIN_STEP = "minitron.training.training.train_step"
RANK_FILE = re.compile(r"rank(\d+)\.jsonl")
FIELDS = {"id", "parent", "name", "args", "start_us", "end_us"}


class TraceError(ValueError):
    """A file of the directory cannot be read as a trace."""


def rank_files(trace_dir: str | Path) -> dict[int, Path]:
    files = {}
    for path in Path(trace_dir).glob("rank*.jsonl"):
        match = RANK_FILE.fullmatch(path.name)
        if match:
            files[int(match.group(1))] = path
    return dict(sorted(files.items()))


def read_rank(path: Path) -> tuple[list[dict], bool]:
    """A rank's records ordered by start time (parents before children), and whether its
    last line was cut short."""
    lines = path.read_text().splitlines()
    records, cut = [], False
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            if number == len(lines):
                cut = True
                continue
            record = None
        if not isinstance(record, dict) or not FIELDS <= record.keys():
            raise TraceError(f"{path}:{number} is not a trace record (one JSON object per line with "
                             f"{', '.join(sorted(FIELDS))})")
        records.append(record)
    return in_trace_order(records), cut


def in_trace_order(records: list[dict]) -> list[dict]:
    """Records by start time, parents before children (a file holds them as calls ended)."""
    return sorted(records, key=lambda r: (r["start_us"], r["id"]))


def read_trace(trace_dir: str | Path) -> tuple[dict[int, list[dict]], list[int]]:
    """rank -> its records ordered by start time, and the ranks whose last line was cut."""
    runs, cut = {}, []
    for rank, path in rank_files(trace_dir).items():
        runs[rank], was_cut = read_rank(path)
        if was_cut:
            cut.append(rank)
    return runs, cut


def load_trace(trace_dir: str | Path) -> dict[int, list[dict]]:
    """rank -> its records, ordered by start time."""
    return read_trace(trace_dir)[0]


def layout_args(records: list[dict]) -> dict | None:
    """The sizes initialize_model_parallel was called with, read from its own trace record."""
    for r in records:
        if r["name"] == INIT_MP:
            a = r["args"]
            return {"tp": a.get("tensor_model_parallel_size", 1), "pp": a.get("pipeline_model_parallel_size", 1),
                    "cp": a.get("context_parallel_size", 1), "ep": a.get("expert_model_parallel_size", 1),
                    "order": a.get("order", "tp-cp-ep-dp-pp")}
    return None


def _init_args(runs: dict[int, list[dict]]) -> dict:
    return next((r["args"] for records in runs.values() for r in records if r["name"] == INIT_PG), {})


def world_size_of(runs: dict[int, list[dict]]) -> int:
    world = _init_args(runs).get("world_size")
    return world if isinstance(world, int) and world > 0 else len(runs)


def backend_of(runs: dict[int, list[dict]]) -> str | None:
    """The backend init_process_group was given ("gloo", "nccl", "fake"), if the trace has it."""
    backend = _init_args(runs).get("backend")
    return backend if isinstance(backend, str) else None


def iterations(runs: dict[int, list[dict]]) -> list[int]:
    """The training iterations (train_step's ``iteration``) that any rank recorded."""
    return sorted({r["args"]["iteration"] for records in runs.values() for r in records
                   if r["name"] == TRAIN_STEP and isinstance(r["args"].get("iteration"), int)})
