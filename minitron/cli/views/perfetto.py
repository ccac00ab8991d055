"""A trace directory as one Chrome trace-event JSON file, ``trace.json`` (opens in Perfetto).

Perfetto (https://ui.perfetto.dev) and chrome://tracing read the trace-event format: one "X"
(complete) event per call with a start and a duration, grouped into rows by ``pid``. We use the rank as pid, so each rank is one row,
named after its place in the layout: ``rank 5 (tp 1, pp 1, dp 0)``.
"""

from __future__ import annotations

import json
from pathlib import Path

from minitron.trace.reader import layout_args, load_trace, world_size_of
from minitron.core.rank_generator import rank_coordinates


def rank_label(rank: int, world_size: int, sizes: dict | None) -> str:
    if not sizes:
        return f"rank {rank}"
    c = rank_coordinates(rank, world_size, sizes["tp"], sizes["pp"], sizes["cp"], sizes["order"])
    extra = f", cp {c['cp']}" if sizes["cp"] > 1 else ""
    return f"rank {rank} (tp {c['tp']}, pp {c['pp']}, dp {c['dp']}{extra})"


def to_chrome(runs: dict[int, list[dict]], note: str | None = None) -> dict:
    """The trace-event JSON object: metadata naming each row, then one X event per call."""
    world = world_size_of(runs)
    events = [event for rank, records in runs.items() for event in rank_events(rank, records, world)]
    trace = {"traceEvents": events, "displayTimeUnit": "ms"}
    if note:
        trace["otherData"] = {"note": note}
    return trace


def rank_events(rank: int, records: list[dict], world: int) -> list[dict]:
    """One rank's row: its name and place, then one X event per call."""
    events = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
               "args": {"name": rank_label(rank, world, layout_args(records))}},
              {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0,
               "args": {"sort_index": rank}}]
    for r in records:
        events.append({
            "ph": "X", "pid": rank, "tid": 0, "ts": r["start_us"],
            "dur": max(r["end_us"] - r["start_us"], 0),
            "name": _short(r), "cat": r["name"].rsplit(".", 1)[0],
            "args": {"name": r["name"], "os_pid": r["pid"], **r["args"]},
        })
    return events


def encoded_rank_events(rank: int, records: list[dict]) -> str:
    """``rank_events`` as the JSON text it takes inside trace.json's event list. A process that
    plays fake ranks encodes its own ranks' rows (see launcher/fake.play_ranks), so that the
    parent only stitches texts together (``write_chrome_trace(..., encoded=...)``)."""
    return json.dumps(rank_events(rank, records, world_size_of({rank: records})))[1:-1]


def _short(record: dict) -> str:
    """Row label: the function name, plus the group for collectives and new_group."""
    name = record["name"].rsplit(".", 1)[-1]
    group = record["args"].get("group_desc") or record["args"].get("group")
    return f"{name} {group}" if group and group != "WORLD" else name


def write_chrome_trace(trace_dir: str | Path, runs: dict[int, list[dict]] | None = None,
                       note: str | None = None, encoded: dict[int, str] | None = None) -> Path:
    """Write ``trace.json``; ``encoded`` (rank -> encoded_rank_events) saves encoding again."""
    out = Path(trace_dir) / "trace.json"
    if encoded is None:
        runs = load_trace(trace_dir) if runs is None else runs
        out.write_text(json.dumps(to_chrome(runs, note)))
        return out
    # The same bytes json.dumps(to_chrome(...)) writes: rows joined as its list separator does.
    tail = {"displayTimeUnit": "ms", **({"otherData": {"note": note}} if note else {})}
    with open(out, "w") as f:
        f.write('{"traceEvents": [')
        f.write(", ".join(text for _, text in sorted(encoded.items()) if text))
        f.write("], " + json.dumps(tail)[1:])
    return out
