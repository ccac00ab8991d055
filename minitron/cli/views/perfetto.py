"""A trace directory as one Chrome trace-event JSON file, ``trace.json`` (opens in Perfetto).

Perfetto (https://ui.perfetto.dev) and chrome://tracing read the trace-event format: one "X"
(complete) event per call with a start and a duration, grouped into rows by ``pid``. We use the rank as pid, so each rank is one row,
named after its place in the layout: ``rank 5 (tp 1, pp 1, dp 0)``.

The file is written compact, as the rank files are (the recorder's ENCODE): a process that
plays fake ranks then builds each row around the text its record's arguments were written as,
instead of encoding them again (a sixth of the JSON work of a 1024-rank fake trace).
"""

from __future__ import annotations

from json.encoder import encode_basestring_ascii as encode_str  # what ENCODE does to a str (ASCII)
from pathlib import Path

from minitron.trace.reader import clock_of, layout_args, load_trace, world_size_of
from minitron.trace.schema import HOST_TIME
from minitron.trace.recorder import ENCODE
from minitron.core.group_layout import rank_coordinates


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
    return {"traceEvents": events, **_tail(runs, note)}


def _tail(runs: dict[int, list[dict]] | None, note: str | None) -> dict:
    """What follows the events: the time unit, and in Perfetto's "metadata" the clock the times
    read (host time, or GPU time on synchronized GPU ranks) and the note, if any."""
    clock = clock_of(runs) if runs else HOST_TIME   # no runs: a fake play's texts, never on a GPU
    return {"displayTimeUnit": "ms", "otherData": {"clock": clock, **({"note": note} if note else {})}}


def rank_events(rank: int, records: list[dict], world: int) -> list[dict]:
    """One rank's row: its name and place, then one X event per call."""
    return _row_heading(rank, records, world) + [_event(rank, r) for r in records]


def _row_heading(rank: int, records: list[dict], world: int) -> list[dict]:
    return [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
             "args": {"name": rank_label(rank, world, layout_args(records))}},
            {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}}]


def _event(rank: int, r: dict) -> dict:
    return {"ph": "X", "pid": rank, "tid": 0, "ts": r["start_us"], "dur": max(r["end_us"] - r["start_us"], 0),
            "name": _short(r), "cat": r["name"].rsplit(".", 1)[0],
            "args": {"name": r["name"], "os_pid": r["pid"], **r["args"]}}


def encoded_rank_events(rank: int, records: list[dict], lines: list[str] | None = None) -> str:
    """``rank_events`` as the JSON text it takes inside trace.json's event list. A process that
    plays fake ranks encodes its own ranks' rows (see launcher/fake.play_ranks), so that the
    parent only stitches texts together (``write_chrome_trace(..., encoded=...)``). ``lines``,
    each record as the recorder wrote it, give each event's arguments already encoded."""
    heading = ENCODE(_row_heading(rank, records, world_size_of({rank: records})))[1:-1]
    if lines is None:
        return ",".join([heading] + [ENCODE(_event(rank, r)) for r in records])
    return ",".join([heading] + [_encoded_event(rank, r, line) for r, line in zip(records, lines)])


def _encoded_event(rank: int, r: dict, line: str) -> str:
    """ENCODE(_event(rank, r)), the record's arguments cut from its line: they sit between its
    "args" and "start_us" keys (schema.new_record's order), and neither key's text can occur
    inside a JSON string, where every quote is escaped. An argument that _event's own keys
    override ("name", "os_pid") or a time that is not an int takes the plain way."""
    args, start, end = r["args"], r["start_us"], r["end_us"]
    if "name" in args or "os_pid" in args or type(start) is not int or type(end) is not int:
        return ENCODE(_event(rank, r))
    encoded = line[line.index(',"args":') + 9:line.rindex(',"start_us":') - 1]  # inside its braces
    name = r["name"]
    return (f'{{"ph":"X","pid":{rank},"tid":0,"ts":{start},"dur":{max(end - start, 0)},'
            f'"name":{encode_str(_short(r))},"cat":{encode_str(name.rsplit(".", 1)[0])},'
            f'"args":{{"name":{encode_str(name)},"os_pid":{r["pid"]}{"," if encoded else ""}{encoded}}}}}')


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
        out.write_text(ENCODE(to_chrome(runs, note)))
        return out
    # The same bytes ENCODE(to_chrome(...)) writes: rows joined as its list separator does.
    tail = _tail(runs, note)
    with open(out, "w") as f:
        f.write('{"traceEvents":[')
        f.write(",".join(text for _, text in sorted(encoded.items()) if text))
        f.write("]," + ENCODE(tail)[1:])
    return out
