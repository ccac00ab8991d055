"""The hang screen: which group waits in which call, who never came, where they are, where the
ranks' sequences part, and what to change. Printed by the launcher's hang watch while the ranks
still live, and by `minitron view DIR --hang` from any trace directory afterwards.

Each fact says where it came from: [trace] minitron's own records (trace/hang.py), [stack] the
Python stack a rank wrote when asked (trace/dump.py), [flight recorder] PyTorch's Flight
Recorder dumps, read with torch's own loader and analyser (flight_recorder.py beside this).
"""

from __future__ import annotations

from pathlib import Path

from minitron.cli.views.flight_recorder import flight_recorder_lines
from minitron.cli.views.words import rank_ranges
from minitron.trace.hang import NEW_GROUPS, diagnose, ordinal, short

STACK_FRAMES = 4   # innermost frames shown per rank: where it is, and what called it
MAX_RANK_LINES = 16


def show_hang(console, trace_dir, silent: list | None = None, timeout: float | None = None) -> dict:
    """Print the diagnosis of ``trace_dir`` and return it (the data: trace/hang.py)."""
    d = diagnose(trace_dir)
    for line in hang_lines(d, silent, timeout):
        console.print(line, highlight=False, markup=False, soft_wrap=True)
    return d


def _list(ranks) -> str:
    """0, 2, 3 or 0-7: the brackets of rank_ranges do not read well inside a sentence."""
    return rank_ranges(sorted(int(r) for r in ranks)).strip("[]").replace(",", ", ")


def _ranks(ranks) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + _list(ranks)


def _group(name: str, ranks: list) -> str:
    return f"{name} (ranks {_list(ranks)})"


def hang_lines(d: dict, silent: list | None = None, timeout: float | None = None) -> list[str]:
    lines = []
    if timeout is not None:
        lines.append(f"HUNG: no rank finished a traced call for {timeout:g} s ({d['world']} ranks). [trace]")
    else:
        lines.append(f"Hang diagnosis of {d['trace_dir']} ({d['world']} ranks). [trace]")
    if not d["stuck"] and not d["point_to_point"]:
        lines.append("  no collective was in flight when the ranks stopped: the trace shows no hang.")
    if d["stuck"] or d["point_to_point"]:
        lines.append("Waiting")
    for s in d["stuck"]:
        calls: dict[str, list] = {}
        for rank, label in s["inside"].items():
            calls.setdefault(label, []).append(int(rank))
        inside = ", ".join(f"{_ranks(rs)} in {label}" for label, rs in calls.items())
        never = _ranks(s["never_entered"]) if s["never_entered"] else \
            "none (all are inside, and still it does not finish)" if len(calls) == 1 else "none"
        lines.append(f"  {_group(s['group'], s['ranks'])}, call #{s['seq']}: {inside}; never entered: {never}")
    for p in d["point_to_point"]:
        state = "which is posted" if p["peer_matching"] else "never posted"
        lines.append(f"  rank {p['rank']} is in {p['call']} {'to' if p['direction'] == 'send' else 'from'} "
                     f"rank {p['peer']}: the matching "
                     f"{'recv' if p['direction'] == 'send' else 'send'} on rank {p['peer']} is {state}")
    lines += ["Diverged"] if d["divergences"] else []
    for v in d["divergences"]:
        first, *others = v["calls"]
        for other in others:
            if v["group"] == NEW_GROUPS:
                lines.append(f"  the {ordinal(v['seq'])} new_group of {_ranks(other['ranks'])} made "
                             f"{other['call'].removeprefix('new_group ')}; that of {_ranks(first['ranks'])} made "
                             f"{first['call'].removeprefix('new_group ')}")
                continue
            verb = "is" if len(other["ranks"]) == 1 else "are"
            lines.append(f"  {_ranks(other['ranks'])}'s {ordinal(v['seq'])} call on {v['group']} {verb} "
                         f"{other['call']}; {_ranks(first['ranks'])} "
                         f"{('is in' if len(first['ranks']) == 1 else 'are in') if first['in_flight'] else 'called'} "
                         f"{first['call']}")
    if d["cycle"]:
        lines.append("Deadlock")
        lines.append("  " + " → ".join(map(str, d["cycle"])) + ": each rank waits for the next, in a ring")
    lines += _where_lines(d, silent or [])
    lines += flight_recorder_lines(Path(d["trace_dir"]))
    if d["stuck"] or d["point_to_point"]:
        lines += ["What to change"] + ["  " + fix for fix in fixes(d)]
    return lines


def _where_lines(d: dict, silent: list) -> list[str]:
    lines = ["Where the ranks are"]
    minority = {r for v in d["divergences"] for c in v["calls"][1:] for r in c["ranks"]}
    detail = set(d["never_entered"]) | minority
    shown = sorted(d["where"], key=lambda r: (int(r) not in detail, int(r)))[:MAX_RANK_LINES]
    for rank in sorted(shown, key=int):
        w = d["where"][rank]
        if w["in"]:
            where = f"in {short(w['in']['name'])}" + (f" on {w['in']['group']}" if "group" in w["in"] else "") \
                if w["in"]["name"].startswith("torch.distributed.") else f"in {w['in']['name']} (a traced step)"
        elif w["last_finished"]:
            where = f"in no traced call; the last it finished: {w['last_finished']['name']}"
        else:
            where = "no call recorded"
        lines.append(f"  rank {rank}: {where} [trace]")
        if int(rank) in detail and w["stack"]:
            frames = [f for f in w["stack"] if "site-packages/torch/" not in f[0]][-STACK_FRAMES:]
            for path, line, name in reversed(frames):
                lines.append(f"      {path}:{line} in {name} [stack]")
        elif int(rank) in detail and int(rank) in silent:
            lines.append("      did not answer the request for its stack [stack]")
    if len(d["where"]) > len(shown):
        lines.append(f"  ... and {len(d['where']) - len(shown)} more ranks (`minitron view DIR --hang --json`)")
    return lines


def fixes(d: dict) -> list[str]:
    """One line per kind of cause found: what to change."""
    out = []
    for v in d["divergences"]:
        if v["group"] == NEW_GROUPS:
            out.append("the ranks created different groups: every rank must call every new_group, in the same "
                       "order, members or not (Megatron's initialize_model_parallel does)")
        else:
            out.append(f"the ranks' calls on {v['group']} differ from call #{v['seq']}: a collective must run on "
                       "every rank of its group; look for a condition only some ranks take around it")
    if d["cycle"] and not d["divergences"]:
        if any(not p["peer_matching"] for p in d["point_to_point"]):
            out.append("a send or recv has no partner on its peer: post both sides of every exchange, in the same "
                       "order (batch_isend_irecv)")
        else:
            out.append("ranks call collectives on different groups in a different order: call them in one "
                       "order on every rank")
    inner = {r: (d["where"].get(str(r)) or {}).get("in") for r in d["never_entered"]}
    stuck_elsewhere = [r for r, call in inner.items() if not call or not call["name"].startswith("torch.distributed.")]
    if stuck_elsewhere and not d["cycle"] and not d["divergences"]:
        out.append(f"{_ranks(stuck_elsewhere)} never reached the collective: it is computing (its stack above "
                   "says where); the collective is not the cause")
    return out or ["nothing in the trace explains the wait: see the ranks' logs"]
