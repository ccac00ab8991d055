"""Why a job hangs, read from its trace: which group waits in which call, who never came, where
those ranks are, and where the ranks' sequences of collectives part.

The one idea: a collective is matched across ranks by its *sequence number in its group*. Each
rank counts the collectives it calls on a group (torch keeps the same count, ``collective_seq_id``
in its Flight Recorder); the k-th call of one rank meets the k-th call of every other member. So
a hang is one of:

* a member never reached call k (it is elsewhere: computing, or waiting in another group);
* the members reached call k, but it is not the same call on every rank (a divergence);
* the members reached "the same" call on groups they do not agree on (their new_group calls,
  which torch numbers in the order each rank makes them, differ).

Point-to-point calls (send, recv, batch_isend_irecv) have no group sequence that matters here:
each waits for one peer, which is checked instead.

Everything comes from the files a traced rank leaves (reader.read_in_flight: the finished records
and the open ones of calls in flight) and the ``rank{R}.where.json`` each rank writes when asked
(trace/dump.py). The result is plain data; minitron/cli/views/hang.py shows it.
"""

from __future__ import annotations

import json
from pathlib import Path

from minitron.trace.dump import WHERE_SUFFIX
from minitron.trace.reader import read_in_flight, world_size_of
from minitron.trace.schema import DIST, NEW_GROUP

COLLECTIVES = {DIST + n for n in ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                                  "reduce_scatter_tensor", "all_gather_single", "reduce_scatter_single", "broadcast",
                                  "reduce", "all_to_all_single", "gather", "scatter", "barrier")}
P2P = {DIST + n for n in ("send", "recv", "batch_isend_irecv")}
MATCHING = {"send": "recv", "recv": "send"}
NEW_GROUPS = "new_group (every rank)"   # the sequence of group creations, which all ranks share


def short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def group_of(record: dict, world: int) -> tuple[str, tuple[int, ...] | str]:
    """(description, ranks) of a collective's group; the ranks as recorded when the recorder did
    not list them (torch_hooks.describe_group writes "128 ranks" for a large group)."""
    args = record["args"]
    ranks = args.get("ranks", "all")
    return args.get("group", "WORLD"), tuple(range(world)) if ranks == "all" else \
        tuple(ranks) if isinstance(ranks, list) else str(ranks)


def peers_of(record: dict) -> list[tuple[str, int]]:
    """(direction, peer) of a point-to-point call: send/recv, or each op of a batch."""
    args, name = record["args"], short(record["name"])
    if name == "batch_isend_irecv":
        return [("send" if "send" in op["op"] else "recv", op["peer"]) for op in args.get("ops", [])]
    peer = args.get("dst" if name == "send" else "src")
    return [(name, peer)] if isinstance(peer, int) else []


def sequences(records: list[dict], world: int) -> dict[tuple, list[dict]]:
    """group -> this rank's collectives on it in call order (finished and in flight); NEW_GROUPS
    -> its new_group calls, one sequence every rank shares."""
    out: dict[tuple, list[dict]] = {}
    for r in sorted(records, key=lambda r: r["id"]):
        if r["name"] in COLLECTIVES:
            out.setdefault(group_of(r, world), []).append(r)
        elif r["name"] == NEW_GROUP:
            out.setdefault((NEW_GROUPS, tuple(range(world))), []).append(r)
    return out


def call_label(record: dict) -> str:
    """What a call is, for comparing ranks: the function, and for new_group the group made."""
    if record["name"] == NEW_GROUP:
        ranks = record["args"].get("ranks")
        return f"new_group {record['args'].get('group_desc') or ''} {ranks}".replace("  ", " ")
    return short(record["name"])


def _where(trace_dir: Path, rank: int, pid: int | None) -> dict | None:
    """The rank's answer to the dump request, if it is this run's (its pid is the trace's)."""
    path = trace_dir / f"rank{rank}{WHERE_SUFFIX}"
    try:
        where = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(where, dict) or (pid is not None and where.get("pid") != pid):
        return None
    return where


def user_frames(stack: list) -> list[list]:
    """The program's own frames: those after the launcher's (runpy, minitron.launcher), without
    the trace's wrappers; innermost last."""
    keep = []
    for frame in stack:
        if not (isinstance(frame, list) and len(frame) == 3):
            continue
        path = str(frame[0])
        if "minitron/launcher/" in path or path.startswith("<frozen runpy>") or "minitron/cli/" in path:
            keep = []   # everything so far was the launcher's
            continue
        if "minitron/trace/" not in path:
            keep.append(frame)
    return keep


def diagnose(trace_dir: str | Path) -> dict:
    """The diagnosis of a trace directory as plain data (see the module docstring)."""
    trace_dir = Path(trace_dir)
    runs, cut, opened = read_in_flight(trace_dir)
    world = world_size_of({**runs, **{r: recs for r, recs in opened.items() if recs}})
    seqs = {rank: sequences(runs[rank] + opened[rank], world) for rank in runs}
    groups = sorted({g for per_rank in seqs.values() for g in per_rank}, key=lambda g: (g[0] != NEW_GROUPS, g))
    stuck, divergences, waits = [], [], {}
    for group in groups:
        # a group recorded without its list: its members are the ranks that called on it
        members = [r for r in group[1] if r in seqs] if isinstance(group[1], tuple) else \
            sorted(r for r in seqs if group in seqs[r])
        calls = {r: seqs[r].get(group, []) for r in members}
        divergence = _divergence(group[0], members, calls)
        if divergence:
            divergences.append(divergence)
        in_flight = {r: (len(c), c[-1]) for r, c in calls.items() if c and c[-1].get("open")}
        for seq in sorted({n for n, _ in in_flight.values()}):
            inside = {str(r): call_label(rec) for r, (n, rec) in in_flight.items() if n == seq}   # str: as in JSON
            never = [r for r in members if len(calls[r]) < seq]
            stuck.append({"group": group[0], "ranks": members, "seq": seq, "inside": inside,
                          "never_entered": never})
            for r in inside:
                waits.setdefault(int(r), set()).update(never)
    p2p = _point_to_point(opened, waits)
    where = {}
    for rank in runs:
        pid = (runs[rank] or opened[rank] or [{}])[0].get("pid")
        answer = _where(trace_dir, rank, pid)
        innermost = opened[rank][-1] if opened[rank] else None
        last = max(runs[rank], key=lambda r: r["end_us"]) if runs[rank] else None
        where[str(rank)] = {"in": _brief(innermost, world) if innermost else None,
                       "last_finished": _brief(last, world) if last else None,
                       "stack": user_frames(answer["stack"]) if answer else None,
                       "flight_recorder": answer.get("flight_recorder") if answer else None}
    return {"trace_dir": str(trace_dir), "world": world, "ranks": sorted(runs), "cut": cut, "stuck": stuck,
            "point_to_point": p2p, "divergences": divergences, "cycle": _cycle(waits), "where": where,
            "never_entered": sorted({r for s in stuck for r in s["never_entered"]} |
                                    {x["peer"] for x in p2p if not x["peer_matching"]})}


def _brief(record: dict, world: int) -> dict:
    out = {"name": record["name"], "id": record["id"], "start_us": record["start_us"]}
    if record["name"] in COLLECTIVES:
        out["group"] = group_of(record, world)[0]
    if record["name"] in P2P:
        out["peers"] = peers_of(record)
    return out


def _divergence(group: str, members: list[int], calls: dict[int, list[dict]]) -> dict | None:
    """The first call number at which the members' calls on ``group`` differ, if any."""
    longest = max((len(c) for c in calls.values()), default=0)
    for k in range(longest):
        labels: dict[str, list[int]] = {}
        for r, c in calls.items():
            if k < len(c):
                labels.setdefault(call_label(c[k]), []).append(r)
        if len(labels) > 1:
            ordered = sorted(labels.items(), key=lambda kv: (-len(kv[1]), kv[1]))
            in_flight = {r for r, c in calls.items() if k < len(c) and c[k].get("open")}
            return {"group": group, "ranks": members, "seq": k + 1,
                    "calls": [{"call": label, "ranks": ranks, "in_flight": all(r in in_flight for r in ranks)}
                              for label, ranks in ordered]}
    return None


def _point_to_point(opened: dict[int, list[dict]], waits: dict[int, set]) -> list[dict]:
    """Each send/recv in flight, its peer, and whether the peer is in the matching call."""
    posted = {(r, d, p) for r, recs in opened.items() for rec in recs if rec["name"] in P2P
              for d, p in peers_of(rec)}
    out = []
    for rank, recs in opened.items():
        for rec in recs:
            if rec["name"] not in P2P:
                continue
            for direction, peer in peers_of(rec):
                matching = (peer, MATCHING[direction], rank) in posted
                out.append({"rank": rank, "call": short(rec["name"]), "direction": direction, "peer": peer,
                            "peer_matching": matching})
                if not matching:
                    waits.setdefault(rank, set()).add(peer)
    return out


def _cycle(waits: dict[int, set]) -> list[int] | None:
    """Ranks that wait for each other in a ring (r0 waits for r1, ..., rn for r0), if any: a
    depth-first walk of who waits for whom, iterative (a world may hold thousands of ranks)."""
    state: dict[int, int] = {}   # 1: on the current path, 2: done, no ring through it
    for start in sorted(waits):
        if state.get(start):
            continue
        path, todo = [start], [iter(sorted(waits[start]))]
        state[start] = 1
        while todo:
            nxt = next(todo[-1], None)
            if nxt is None:
                state[path.pop()] = 2
                todo.pop()
            elif state.get(nxt) == 1:
                return path[path.index(nxt):] + [nxt]
            elif not state.get(nxt):
                state[nxt] = 1
                path.append(nxt)
                todo.append(iter(sorted(waits.get(nxt, ()))))
    return None
