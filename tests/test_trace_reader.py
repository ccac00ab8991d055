"""The one validated reader of trace directories (minitron/trace/reader.py), from the outside.

A table of broken trace directories — each a good two-rank trace with one thing wrong, as the
battery of issues 24 and 25 found them — goes through `view`, `diff` and `estimate --check`:
every one must be ONE line naming the file and line of the first bad record, exit code 2, no
traceback, no torch imported, within a memory cap and a timeout (tests/refusals.py runs them
in a torch-free interpreter, a few forked one child each). Then a property test feeds the reader random
and mutated files: it returns a trace the views can show, or raises TraceError, nothing else.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cli_here import minitron_here
from refusals import Case, run_cases

from minitron.trace.reader import TraceError, read_trace
from minitron.trace.schema import FIELDS, MAX_CALL_DEPTH, MAX_WORLD, new_record

BIN = Path(sys.executable).parent
DIST = "torch.distributed."
INIT_MP = "minitron.core.parallel_state.initialize_model_parallel"
STEP = "minitron.training.training.train_step"
BEYOND = MAX_WORLD + 4464  # a rank no trace may hold


def good_rank(rank: int, world: int = 2) -> list[dict]:
    """One rank's records in file order (as calls ended: callees before callers)."""
    def rec(call_id, parent, name, start, end, **args):
        return new_record(rank, 100 + rank, call_id, parent, name, args, start, end)
    ranks = list(range(world))
    return [
        rec(1, 0, DIST + "init_process_group", 10, 20, backend="gloo", world_size=world),
        rec(3, 2, DIST + "new_group", 30, 31, ranks=ranks, group_desc="PIPELINE_MODEL_PARALLEL_GROUP",
            backend="default", member=True),
        rec(2, 0, INIT_MP, 25, 40, tensor_model_parallel_size=1, pipeline_model_parallel_size=world,
            context_parallel_size=1, expert_model_parallel_size=1, order="tp-cp-ep-dp-pp"),
        rec(5, 4, DIST + "all_reduce", 55, 60, shape=[4, 8], dtype="float32",
            group="PIPELINE_MODEL_PARALLEL_GROUP", ranks=ranks),
        rec(4, 0, STEP, 50, 70, iteration=0),
        rec(0, None, "minitron.training.training.pretrain", 0, 100),
        # Written after their caller, as no recorder would, which the reader does not mind.
        rec(6, 4, "minitron.core.pipeline_parallel.schedules.forward_step", 61, 62, microbatch=0, chunk=None),
        rec(7, 4, DIST + "batch_isend_irecv", 63, 64, group="PIPELINE_MODEL_PARALLEL_GROUP", ranks=ranks,
            ops=[{"op": "isend", "peer": 1 - rank, "shape": [2, 3], "dtype": "bfloat16"}]),
    ]


def write(path: Path, rank: int, lines: list) -> None:
    """A rank file from records (dicts, dumped) and raw lines (bytes, written as they are)."""
    path.mkdir(parents=True, exist_ok=True)
    data = b"".join(line if isinstance(line, bytes) else json.dumps(line).encode() + b"\n" for line in lines)
    (path / f"rank{rank}.jsonl").write_bytes(data)


def good_trace(path: Path, world: int = 2) -> Path:
    for rank in range(world):
        write(path, rank, good_rank(rank, world))
    return path


def field(line: int, key: str, value):
    """Rank 1's record on ``line`` (1-based) with ``key`` set to ``value``."""
    def mutate(records):
        records[line - 1][key] = value
    return mutate


def arg(line: int, key: str, value):
    def mutate(records):
        records[line - 1]["args"][key] = value
    return mutate


def drop(line: int, key: str):
    def mutate(records):
        del records[line - 1][key]
    return mutate


def raw(line: int, data: bytes):
    def mutate(records):
        records[line - 1] = data
    return mutate


def nested(levels: int):
    value = 0
    for _ in range(levels):
        value = [value]
    return value


def deep_chain(records):
    """Rank 1 becomes a chain of calls each inside the one before, one deeper than allowed."""
    records[:] = [new_record(1, 101, i, i - 1 if i else None, "f", {}, i, 10_000 - i)
                  for i in range(MAX_CALL_DEPTH, -1, -1)]


# (name, what to do to rank 1's records, the line named, words the refusal must contain).
# Line None: the file is named without a line (it is not a file the reader can open as one).
BROKEN = [
    ("empty file", lambda r: r.clear(), 1, "is empty"),
    ("only blank lines", lambda r: r.__setitem__(slice(None), [b"\n", b"  \n"]), 1, "is empty"),
    ("only a cut line", lambda r: r.__setitem__(slice(None), [b'{"rank": 1, "pid"']), 1, "cut short"),
    ("not UTF-8", raw(2, b'{"name": "\xff\xfe"}\n'), 2, "not UTF-8"),
    ("nested 10,000 deep", raw(2, b"[" * 10_000 + b"]" * 10_000 + b"\n"), 2, "deeper"),
    ("not JSON mid-file", raw(3, b"{this is not json}\n"), 3, "not JSON"),
    ("bad last line that ends its line", raw(6, b'{"rank": 1\n'), 6, "not JSON"),
    ("a list, not an object", raw(2, b"[1, 2, 3]\n"), 2, "not a JSON object"),
    ("a line longer than 1 MiB", raw(2, b'"' + b"x" * (1 << 20) + b'"\n'), 2, "longer than 1 MiB"),
    ("start time a string", field(2, "start_us", "30"), 2, "start_us is '30'"),
    ("end time a bool", field(2, "end_us", True), 2, "end_us is True"),
    ("NaN start", field(2, "start_us", float("nan")), 2, "not a finite time"),
    ("infinite end", field(2, "end_us", float("inf")), 2, "not a finite time"),
    ("an end too large for a float", field(2, "end_us", 10**400), 2, "not a finite time"),
    ("end before start", field(6, "end_us", -2_000_000_000), 6, "ends before it starts"),
    ("args null", field(2, "args", None), 2, "args is None"),
    ("args a list", field(2, "args", [1, 2]), 2, "args is [1, 2]"),
    ("args nested 20 deep", arg(5, "extra", nested(20)), 5, "args nest more than"),
    ("name a number", field(4, "name", 42), 4, "name is 42"),
    ("name empty", field(4, "name", ""), 4, "name is empty"),
    ("id a string", field(2, "id", "3"), 2, "id is '3'"),
    ("id negative", field(2, "id", -3), 2, "id is -3"),
    ("id missing", drop(2, "id"), 2, "has no id"),
    ("end missing", drop(3, "end_us"), 3, "has no end_us"),
    ("pid a string", field(1, "pid", "101"), 1, "pid is '101'"),
    ("rank of another file", field(1, "rank", 0), 1, "rank is 0 in the file of rank 1"),
    ("error not a string", field(1, "error", 7), 1, "error is 7"),
    ("duplicate ids", field(3, "id", 3), 3, "also the id of line 2"),
    ("parent is itself", field(2, "parent", 3), 2, "did not begin before"),
    ("parent cycle", field(6, "parent", 4), 6, "did not begin before"),
    ("parent a string", field(2, "parent", "2"), 2, "parent is '2'"),
    ("call tree too deep", deep_chain, 1, f"more than {MAX_CALL_DEPTH} calls deep"),
    ("world a string", arg(1, "world_size", "2"), 1, "world_size of torch.distributed.init_process_group"),
    ("world zero", arg(1, "world_size", 0), 1, f"from 1 to {MAX_WORLD}"),
    ("world -2", arg(1, "world_size", -2), 1, "-1 or a whole number"),
    ("world of a billion", arg(1, "world_size", 10**9), 1, f"from 1 to {MAX_WORLD}"),
    ("world disagrees", arg(1, "world_size", 4), 1, "disagrees with world_size 2"),
    ("backend a number", arg(1, "backend", 3), 1, "argument backend"),
    ("new_group without ranks", lambda r: r[1]["args"].pop("ranks"), 2, "has no argument 'ranks'"),
    ("new_group ranks a number", arg(2, "ranks", 2), 2, "not a list of ranks"),
    ("tp that does not fit the world", arg(3, "tensor_model_parallel_size", 3), 3, "do not fit the world"),
    ("an order Megatron does not know", arg(3, "order", "tp-xx"), 3, "do not fit the world"),
    ("iteration a string", arg(5, "iteration", "0"), 5, "argument iteration"),
    ("a shape of strings", arg(4, "shape", ["4"]), 4, "argument shape"),
    ("send ops without peers", arg(4, "ops", [{"op": "isend", "shape": [2]}]), 4, "argument ops"),
]


def broken_dir(root: Path, name: str, mutate) -> Path:
    """A good trace whose rank 1 file was broken by ``mutate`` (or replaced, for the file kinds)."""
    path = good_trace(root / name.replace(" ", "_").replace(",", ""))
    records = good_rank(1)
    mutate(records)
    write(path, 1, records)
    return path


@pytest.fixture(scope="module")
def dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("traces")
    made = {name: broken_dir(root, name, mutate) for name, mutate, _, _ in BROKEN}
    kinds = [("a directory", lambda p: p.mkdir()), ("a link to /dev/zero", lambda p: p.symlink_to("/dev/zero")),
             ("a named pipe", os.mkfifo)]   # opening it would wait for a writer forever
    for name, make in kinds:
        path = good_trace(root / name.replace(" ", "_").replace("/", ""))
        (path / "rank1.jsonl").unlink()
        make(path / "rank1.jsonl")
        made[name] = path
    made["rank beyond the world"] = good_trace(root / "beyond")
    write(made["rank beyond the world"], 5, good_rank(5))
    made["rank beyond any world"] = root / "no_world"   # no init_process_group to name the world
    write(made["rank beyond any world"], BEYOND, [new_record(BEYOND, 1, 0, None, "f", {}, 0, 1)])
    made["good"] = good_trace(root / "good")
    made["no such directory"] = root / "missing"
    made["a file, not a directory"] = made["good"] / "rank0.jsonl"
    made["a directory without rank files"] = root / "notes"
    (root / "notes").mkdir()
    (root / "notes" / "rank07.jsonl").write_text("a name no rank file has\n")
    return made


FILE_KINDS = [("a directory", "is a directory"), ("a link to /dev/zero", "not a regular file"),
              ("a named pipe", "not a regular file")]
DIRECTORIES = [("no such directory", "holds no rank*.jsonl files: it does not exist"),
               ("a file, not a directory", "holds no rank*.jsonl files: it is not a directory"),
               ("a directory without rank files", "holds no rank*.jsonl files: nothing was traced there")]
COMMANDS = {"view": lambda d, good: ["view", d], "diff": lambda d, good: ["diff", good, d],
            "estimate --check": lambda d, good: ["estimate", "--check", d]}


def test_every_broken_trace_is_one_line_naming_its_file_and_line(dirs):
    expected = [(name, f"rank1.jsonl:{line}:", words) for name, _, line, words in BROKEN]
    expected += [(name, "rank1.jsonl:", words) for name, words in FILE_KINDS]
    expected.append(("rank beyond the world", "rank5.jsonl:1:", "outside the world of 2 ranks"))
    expected.append(("rank beyond any world", f"rank{BEYOND}.jsonl:1:", f"beyond the {MAX_WORLD} ranks"))
    expected += [(name, "", words) for name, words in DIRECTORIES]
    cases, musts = [], []
    for command, argv in COMMANDS.items():
        for name, where, words in expected:
            cases.append(Case(argv(str(dirs[name]), str(dirs["good"])), timeout=20, id=f"{command}: {name}"))
            musts.append((str(dirs[name] / where), words))
    assert len(cases) >= 40
    # A few forked one child each, as a user's fresh process would be; the rest one after another
    # in one torch-free harness (refusals.py: ~5 ms of CPU a case instead of ~20).
    forked = {"view: parent cycle", "diff: a named pipe", "estimate --check: rank beyond any world"}
    assert forked <= {case.id for case in cases}
    found = {o.case.id: o for o in run_cases([c for c in cases if c.id in forked])}
    found.update((o.case.id, o) for o in run_cases([c for c in cases if c.id not in forked], fork=False))
    problems = []
    for outcome, must in zip([found[case.id] for case in cases], musts):
        found = outcome.refusal_problems(must_contain=must)
        if found:
            problems.append(f"{outcome.case.id}: {'; '.join(found)}\n  {outcome.stderr.strip()[:300]!r}")
    assert not problems, "\n".join(problems)


def test_a_good_trace_and_a_rank_cut_mid_write_are_read(dirs, tmp_path):
    # Exit 1, not 0: the hand-made trace has no whole pretrain chain, and the checks say so.
    proc = minitron_here("view", dirs["good"], "--show", "tree", env={**os.environ, "COLUMNS": "100"})
    assert proc.returncode == 1 and "all_reduce" in proc.stdout and not proc.stderr, proc.stderr
    cut = good_trace(tmp_path / "cut")
    with open(cut / "rank1.jsonl", "ab") as f:
        f.write(b'{"rank": 1, "pid": 101, "id": 6, "par')
    proc = minitron_here("view", cut, "--rank", "1", "--show", "tree")
    assert proc.returncode == 1 and "was cut short" in proc.stdout.replace("\n", " "), proc.stdout
    assert minitron_here("diff", cut, dirs["good"]).returncode == 0   # diff has no checks


def test_the_deepest_tree_the_reader_takes_is_one_every_view_shows(tmp_path):
    """The reader bounds the depth so that the views may recurse: at the bound, they still work,
    from a stack already some frames deep (pytest's own)."""
    from rich.console import Console

    from minitron.cli.views.diff import summarize
    from minitron.cli.views.show import show_views

    records = []
    deep_chain(records)
    write(tmp_path, 1, records[1:])   # one level less: exactly MAX_CALL_DEPTH deep
    runs, _ = read_trace(tmp_path)
    console = Console(file=open(os.devnull, "w"), width=500, record=True)   # 4 columns a level
    show_views(console, runs, {"tree", "groups", "checks"}, 1)
    assert console.export_text().count("f  ") == MAX_CALL_DEPTH and summarize(runs)["world"] == 2


def test_the_recorder_writes_the_fields_the_reader_checks():
    assert list(new_record(0, 1, 2, None, "f", {}, 3, 4)) == list(FIELDS)


@pytest.mark.parametrize("name", ["parent cycle", "a link to /dev/zero", "empty file"])
def test_the_real_executable_refuses_without_importing_torch(dirs, name):
    """As a user runs it: the refusal comes from the reader, before any view or torch loads."""
    proc = subprocess.run([str(BIN / "minitron"), "view", str(dirs[name])], capture_output=True, text=True,
                          timeout=60, env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    lines = [line for line in proc.stderr.splitlines() if not line.startswith("import time:")]
    assert proc.returncode == 2 and len(lines) == 1 and "rank1.jsonl" in lines[0], proc.stderr[-2000:]
    imported = {line.split("|")[-1].strip() for line in proc.stderr.splitlines() if line.startswith("import time:")}
    assert "torch" not in imported and "minitron.cli.views.show" not in imported


# --- the property: a trace, or TraceError, never anything else ------------------------------

SCALARS = st.none() | st.booleans() | st.integers() | st.integers(-10**400, 10**400) | st.floats() | st.text(max_size=8)
JSON = st.recursive(SCALARS,
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                    max_leaves=12)
# The fields, and the arguments the views read (trace/validate.py's ARGS and COLLECTIVE).
KEYS = list(FIELDS) + ["error", "world_size", "backend", "ranks", "group_desc", "group", "shape", "dtype",
                       "ops", "iteration", "microbatch", "chunk", "tensor_model_parallel_size", "order"]
NEAR = st.sampled_from([0, -1, 2**63, "all", [0, 1], [[2], [3]], "bfloat16", "tp-pp-dp", None,
                        [{"op": "isend", "peer": 0, "shape": [2], "dtype": "no-such-type"}],
                        [{"op": "irecv", "peer": -5, "shape": []}]])


@st.composite
def rank_file(draw) -> list:
    """A good rank file with a few random edits: a field or an argument set to any JSON value or
    deleted, a line replaced by random bytes or cut, lines swapped or dropped."""
    records = good_rank(1)
    # Values are copied in: NEAR's lists are the same objects in every example, and an edit in
    # place would change what later examples draw (or put a list inside itself).
    for _ in range(draw(st.integers(1, 4))):
        line = draw(st.integers(0, len(records) - 1))
        edit = draw(st.sampled_from(["field", "arg", "deep", "delete", "bytes", "cut", "swap", "drop"]))
        target = records[line]
        if edit in ("field", "arg", "delete") and isinstance(target, dict):
            where = target if edit != "arg" or not isinstance(target.get("args"), dict) else target["args"]
            key = draw(st.sampled_from(KEYS))
            if edit == "delete":
                where.pop(key, None)
            else:
                where[key] = copy.deepcopy(draw(JSON | NEAR))
        elif edit == "deep" and isinstance(target, dict) and isinstance(target.get("args"), dict) and target["args"]:
            # down into the arguments as they are (an op's dtype, a shape's size), then replace
            where, key = target["args"], draw(st.sampled_from(sorted(target["args"])))
            while isinstance(where[key], (dict, list)) and where[key] and draw(st.booleans()):
                where = where[key]
                key = draw(st.sampled_from(sorted(where) if isinstance(where, dict) else range(len(where))))
            where[key] = copy.deepcopy(draw(JSON | NEAR))
        elif edit == "bytes":
            records[line] = draw(st.binary(max_size=40)).replace(b"\n", b"") + b"\n"
        elif edit == "cut":
            text = records[line] if isinstance(records[line], bytes) else json.dumps(records[line]).encode() + b"\n"
            records[line] = text[:draw(st.integers(0, max(len(text) - 1, 0)))]
        elif edit == "swap":
            other = draw(st.integers(0, len(records) - 1))
            records[line], records[other] = records[other], records[line]
        elif edit == "drop" and len(records) > 1:
            records.pop(line)
    return records


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(rank_file())
def test_the_reader_returns_a_showable_trace_or_raises_trace_error(tmp_path, records):
    from rich.console import Console

    from minitron.cli.views.checks import check_trace, layout_problem
    from minitron.cli.views.diff import summarize
    from minitron.cli.views.perfetto import to_chrome
    from minitron.cli.views.show import show_views

    path = tmp_path / "t"
    write(path, 0, good_rank(0))
    write(path, 1, records)
    try:
        runs, _ = read_trace(path, check=layout_problem)
    except TraceError as exc:
        assert "\n" not in str(exc) and "rank1.jsonl" in str(exc)
        return
    # What was returned, every view can show: nothing raises.
    console = Console(file=open(os.devnull, "w"), width=80)
    for rank in runs:
        show_views(console, runs, {"tree", "groups", "checks", "schedule"}, rank)
    check_trace(runs)
    json.dumps(to_chrome(runs))
    summarize(runs)
