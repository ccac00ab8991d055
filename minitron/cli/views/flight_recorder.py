"""PyTorch's Flight Recorder dumps, in the hang screen: read with torch's own loader, and handed to
torch's own analyser (torch.distributed.flight_recorder) where the installed torch has one.

The Flight Recorder is torch's ring buffer of each process's last collectives (a rank's hang
watch turns it on: launcher/hang_watch.py). A dump is a pickle, one per rank, named
``fr_rank{R}`` (the prefix torch's analyser infers). Each entry: the call (``profiling_name``,
e.g. ``nccl:all_reduce``), its group, its ``collective_seq_id`` in that group (the number
minitron counts too) and its state. Lines from here are marked [flight recorder].

The dumps are pickles: read only those a run of yours wrote (pickle runs code on load).
"""

from __future__ import annotations

import contextlib
import io
import logging
from pathlib import Path

from minitron.trace.dump import FR_DIR, FR_PREFIX

TAG = "[flight recorder]"


@contextlib.contextmanager
def _quiet():
    """torch's analyser logs its notes (a missing `tabulate`, its matching) to the terminal."""
    logger = logging.getLogger("Flight Recorder")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        logger.setLevel(level)


def flight_recorder_lines(trace_dir: Path) -> list[str]:
    folder = trace_dir / FR_DIR
    dumps = sorted(folder.glob(f"{FR_PREFIX}*")) if folder.is_dir() else []
    if not dumps:
        return []
    lines = ["PyTorch's Flight Recorder (its own record of each rank's collectives)"]
    try:
        with _quiet():
            # lazy: torch loads only when there are dumps, and older torch has no such analyser
            from torch.distributed.flight_recorder.components.loader import read_dump
    except ImportError:
        return lines + [f"  this torch has no flight_recorder analyser: {len(dumps)} dumps in {folder} not read {TAG}"]
    for path in dumps:
        try:
            dump = read_dump(FR_PREFIX, str(path))
        except Exception as exc:   # a dump cut short by the kill, or of another torch's format
            lines.append(f"  {path.name}: unreadable ({type(exc).__name__}: {exc}) {TAG}")
            continue
        lines.append(f"  rank {dump['rank']}: {_last_open(dump['entries'])} {TAG}")
    lines.append("  " + _analysis(folder))
    return lines


def _last_open(entries: list) -> str:
    """The rank's last collective that had not finished (else its last), as torch recorded it."""
    if not entries:
        return "no collective recorded"
    pending = [e for e in entries if not e.get("retired") or e.get("state") not in ("completed",)]
    open_ones = [e for e in pending if not e.get("retired")]
    entry = (open_ones or entries)[-1]
    desc = entry.get("process_group", ("", ""))[1] or entry.get("process_group", ("", ""))[0]
    seq = entry.get("p2p_seq_id") if entry.get("is_p2p") else entry.get("collective_seq_id")
    kind = "point-to-point" if entry.get("is_p2p") else "collective"
    done = "finished" if entry.get("retired") else "not finished"
    return (f"{entry.get('profiling_name')} on {desc}, {kind} #{seq}, state {entry.get('state')}, {done} "
            f"({len(entries)} entries)")


def _analysis(folder: Path) -> str:
    """What torch's analyser makes of the dumps together (it pairs the ranks' entries)."""
    try:
        with _quiet():
            # lazy: as read_dump above (only with dumps; absent from older torch)
            from torch.distributed.flight_recorder.components.builder import build_db
            from torch.distributed.flight_recorder.components.config_manager import JobConfig
            from torch.distributed.flight_recorder.components.loader import read_dir
            args = JobConfig().parse_args([str(folder), "--prefix", FR_PREFIX, "--allow-incomplete-ranks"])
            details, version = read_dir(args)
            db = build_db(details, args, version)
    except SystemExit:
        return f"torch's analyser refused these dumps {TAG}"
    except Exception as exc:   # noqa: BLE001 -- torch's analyser on dumps it may not expect
        return (f"torch's analyser could not pair the dumps ({type(exc).__name__}: {exc}); gloo's dumps name "
                f"their groups differently in pg_config and in the entries {TAG}")
    return (f"torch's analyser paired {len(db.collectives)} collectives across ranks; "
            f"{len(db.ncclcalls)} calls stayed unpaired {TAG}")
