"""What makes one parsed line a trace record: the fields of schema.FIELDS with their types, sane
times, and — for the calls the views read arguments of — arguments of the right kinds.

Each function returns what is wrong (a phrase the reader puts after ``FILE:LINE:``) or None.
Nothing here raises on any JSON value, and nothing recurses on how deep the value nests.
"""

from __future__ import annotations

import json
import math

from minitron.trace.schema import (
    DIST, FIELDS, MAX_ARGS_DEPTH, MAX_CALL_DEPTH, MAX_TIME_US, MAX_WORLD, OPTIONAL, PLAYED, ROOT,
)


def shown(value) -> str:
    """A value as the error line quotes it: short, on one line (repr escapes newlines)."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# Types are compared exactly, not with isinstance: JSON's true is a bool, which Python counts as
# an int, and a bool is never a rank or a size. (The exact test is also the fast one: a
# 512-rank trace holds lists of hundreds of ranks.)
def _int(value) -> bool:
    return type(value) is int


def _ints(value) -> bool:
    return type(value) is list and set(map(type, value)) <= {int}


def _op(value) -> bool:
    return (type(value) is dict and type(value.get("op")) is str and _int(value.get("peer"))
            and _ints(value.get("shape")) and type(value.get("dtype", "")) is str)


# An argument's kind -> (test, what the error line says it must be).
KINDS = {
    "int": (_int, "a whole number"),
    "int|null": (lambda v: v is None or _int(v), "a whole number or null"),
    "size": (lambda v: _int(v) and v >= 1, "a whole number, 1 or more"),
    # -1 is torch's "from the environment" (TorchBackend passes it on when no size was given)
    "world": (lambda v: _int(v) and (v == -1 or 1 <= v <= MAX_WORLD), f"-1 or a whole number from 1 to {MAX_WORLD}"),
    "played world": (lambda v: _int(v) and 1 <= v <= MAX_WORLD, f"a whole number from 1 to {MAX_WORLD}"),
    # "all", or the ranks played, each once, in order (the reader checks them against the world)
    "played": (lambda v: v == "all" or (_ints(v) and v and v == sorted(set(v)) and v[0] >= 0),
               '"all" or the ranks played, ascending, each once'),
    "str": (lambda v: type(v) is str, "a string"),
    "str|null": (lambda v: v is None or type(v) is str, "a string or null"),
    # a string where a list would be long or unknown: "all", "128 ranks" (torch_hooks.describe_group)
    "ranks": (lambda v: type(v) is str or _ints(v), 'a list of ranks or a string ("all")'),
    "shape": (lambda v: _ints(v) or (type(v) is list and all(map(_ints, v))), "a list of sizes"),
    "shape|null": (lambda v: v is None or KINDS["shape"][0](v), "a list of sizes or null"),
    "ops": (lambda v: type(v) is list and all(map(_op, v)), "a list of {op, peer, shape}"),
    # the fake launcher's count of unrecorded new_group calls, per group description
    "counts": (lambda v: type(v) is dict and all(_int(n) and n >= 0 for n in v.values()),
               "an object of counts (whole numbers, 0 or more)"),
}
SIZES = ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size",
         "expert_model_parallel_size")
STEP = {"microbatch": "int|null", "chunk": "int|null"}  # chunk: null without a virtual pipeline
# call name -> {argument: kind}. Only the arguments the views read are here; others pass as the
# recorder wrote them. REQUIRED: the arguments a view indexes without asking.
ARGS = {
    DIST + "init_process_group": {"world_size": "world", "backend": "str|null"},
    DIST + "new_group": {"ranks": "ranks", "group_desc": "str|null", "backend": "str"},
    "minitron.core.parallel_state.initialize_model_parallel": {**{s: "size" for s in SIZES}, "order": "str"},
    "minitron.training.training.train_step": {"iteration": "int"},
    PLAYED: {"world_size": "played world", "ranks": "played", "unrecorded_new_groups": "counts"},
    "minitron.core.pipeline_parallel.schedules.forward_step": STEP,
    "minitron.core.pipeline_parallel.schedules.backward_step": STEP,
}
COLLECTIVE = {"group": "str", "ranks": "ranks", "shape": "shape", "input_shape": "shape|null", "dtype": "str",
              "ops": "ops"}
REQUIRED = {DIST + "new_group": ("ranks", "group_desc"), PLAYED: ("world_size", "ranks")}
_TYPED = (*FIELDS.items(), *OPTIONAL.items())


def record_problem(record, rank: int, brackets: int | None = None) -> str | None:
    """What is wrong with ``record`` as a record of ``rank``'s file, if anything. ``brackets``:
    how many [ and { its line holds, a bound on how deep it nests (None: not known)."""
    if type(record) is not dict:
        return f"is {shown(record)}, not a JSON object"
    if not FIELDS.keys() <= record.keys():
        missing = [f for f in FIELDS if f not in record]
        return f"has no {', '.join(missing)} (a record has {', '.join(FIELDS)})"
    for field, (types, says) in _TYPED:
        if field in record and type(record[field]) not in types:
            return f"{field} is {shown(record[field])}, not {says}"
    if record["rank"] != rank:
        return f"rank is {record['rank']} in the file of rank {rank}"
    if record["id"] < 0:
        return f"id is {record['id']}, not a call number (0 or more)"
    if not record["name"]:
        return "name is empty"
    for field in ("start_us", "end_us"):
        # abs() first: math.isfinite would overflow on an int too large for a float
        if not abs(record[field]) <= MAX_TIME_US or math.isnan(record[field]):
            return f"{field} is {shown(record[field])}, not a finite time within ±2**53 µs"
    start, end = record["start_us"], record["end_us"]
    if end < start:
        return f"ends before it starts (start_us {start}, end_us {end})"
    return args_problem(record["name"], record["args"], brackets)


def args_problem(name: str, args: dict, brackets: int | None = None) -> str | None:
    """Arguments nested too deep for the views, or of a kind the views cannot read."""
    if (brackets is None or brackets > MAX_ARGS_DEPTH) and _depth(args) > MAX_ARGS_DEPTH:
        return f"args nest more than {MAX_ARGS_DEPTH} levels deep (the recorder writes a few)"
    spec = ARGS.get(name) or (COLLECTIVE if name.startswith(DIST) else None)
    if spec is None:
        return None
    for key in REQUIRED.get(name, ()):
        if key not in args:
            return f"{name} has no argument {key!r}"
    for key, kind in spec.items():
        if key in args:
            test, says = KINDS[kind]
            if not test(args[key]):
                return f"argument {key} of {name} is {shown(args[key])}, not {says}"
    return None


def _depth(value) -> int:
    """How deep lists and objects nest in ``value`` (iteratively: the nesting is the input's)."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, level = stack.pop()
        if type(item) in (dict, list):
            deepest = max(deepest, level)
            if level <= MAX_ARGS_DEPTH:  # past the bound the answer is already known
                stack.extend((v, level + 1) for v in (item.values() if isinstance(item, dict) else item))
    return deepest


def link_problem(record: dict, line_of: dict[int, int]) -> str | None:
    """An id used before, or a caller that did not begin first: the calls would not be trees."""
    call_id, parent = record["id"], record["parent"]
    if call_id in line_of:
        return f"id {call_id} is also the id of line {line_of[call_id]}; a rank numbers each call once"
    if parent is not ROOT and parent >= call_id:
        return (f"parent {parent} did not begin before call {call_id} (a caller's id is smaller than its "
                f"callees'), so the calls do not form a tree")
    return None


def depth_problem(records: list[dict]) -> tuple[int, str] | None:
    """The first call nested more than MAX_CALL_DEPTH deep (its id, what is wrong), so that a
    view may walk a tree by recursion; None if none is."""
    depth: dict[int, int] = {}
    for r in sorted(records, key=lambda r: r["id"]):   # callers first: their ids are smaller
        depth[r["id"]] = depth.get(r["parent"], 0) + 1
        if depth[r["id"]] > MAX_CALL_DEPTH:
            return r["id"], f"call {r['id']} is nested more than {MAX_CALL_DEPTH} calls deep"
    return None


def unreadable(exc: Exception) -> str:
    """Why a line did not parse, as the reader words it."""
    if isinstance(exc, UnicodeDecodeError):
        return f"is not UTF-8 text (byte {exc.object[exc.start]:#04x} at column {exc.start + 1})"
    if isinstance(exc, RecursionError):
        return "nests lists or objects deeper than Python's JSON reader goes"
    if isinstance(exc, json.JSONDecodeError):
        return f"is not JSON ({exc.msg} at column {exc.colno})"
    return f"is not JSON ({exc})"
