"""`minitron view DIR` and the views it shares with `minitron trace`.

The renderers are checked on small hand-made traces (exact, instant); the command itself on the
trace of a real torchrun run, which is how issue 9 checks it, and on a directory with no trace.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from rich.console import Console

from minitron.cli.views.call_tree import FocusError, call_tree
from minitron.cli.views.checks import check_lines, check_trace
from minitron.cli.views.show import show_views
from minitron.cli.views.words import fitted_name, plural, rank_ranges
from cli_here import run_minitron

BIN = Path(sys.executable).parent
SCHEDULES = "minitron.core.pipeline_parallel.schedules."


def render(renderable, width: int = 80) -> str:
    console = Console(width=width, record=True, file=open(os.devnull, "w"), color_system=None)
    console.print(renderable)
    return console.export_text()


class Trace:
    """Builds one rank's records as the recorder writes them: ids in call order, parents
    before children, times in microseconds."""

    def __init__(self, rank: int = 0):
        self.rank, self.records, self.clock = rank, [], 0

    def call(self, name: str, parent: dict | None = None, us: int = 1000, **args) -> dict:
        record = {"rank": self.rank, "pid": 100 + self.rank, "id": len(self.records),
                  "parent": None if parent is None else parent["id"], "name": name, "args": args,
                  "start_us": self.clock, "end_us": self.clock + us}
        self.clock += 1
        self.records.append(record)
        return record


def training_rank(rank: int, pp: int = 2, microbatches: int = 2) -> list[dict]:
    """pretrain -> train -> train_step -> the 1F1B schedule of one stage, pp stages, tp 1."""
    t = Trace(rank)
    root = t.call("minitron.training.training.pretrain", us=10_000)
    t.call("minitron.core.parallel_state.initialize_model_parallel", root, tensor_model_parallel_size=1,
           pipeline_model_parallel_size=pp, context_parallel_size=1, expert_model_parallel_size=1,
           order="tp-cp-ep-dp-pp")
    step = t.call("minitron.training.training.train_step", t.call("minitron.training.training.train", root),
                  iteration=0)
    schedule = t.call(SCHEDULES + "forward_backward_pipelining_without_interleaving", step)
    warmup = min(pp - rank - 1, microbatches)
    order = [("F", m) for m in range(warmup)]
    for m in range(microbatches - warmup):
        order += [("F", warmup + m), ("B", m)]
    order += [("B", m) for m in range(microbatches - warmup, microbatches)]
    for kind, m in order:
        t.call(SCHEDULES + ("forward_step" if kind == "F" else "backward_step"), schedule, microbatch=m)
    return t.records


def test_rank_lists_read_as_ranges_and_counts_take_the_right_noun():
    assert rank_ranges(list(range(128))) == "[0-127]"
    assert rank_ranges([0, 2, 4, 5, 6, 7]) == "[0,2,4-7]"
    assert rank_ranges([0, 1]) == "[0,1]"                        # a pair stays a pair
    assert rank_ranges([0, 1, 4, 5, 8, 9, 2, 3]) == "[0,1,4,5,8,9,2,3]"  # Megatron's order is kept
    assert rank_ranges("all") == "all"
    assert (plural(1, "process", "processes"), plural(2, "process", "processes")) == ("1 process", "2 processes")
    assert (plural(1, "call"), plural(3, "call")) == ("1 call", "3 calls")


def test_names_drop_packages_only_as_far_as_the_line_needs():
    name = SCHEDULES + "forward_step"
    assert fitted_name(name, 80) == "core.pipeline_parallel.schedules.forward_step"
    assert fitted_name(name, 30) == "schedules.forward_step"
    assert fitted_name(name, 5) == "forward_step"
    assert fitted_name("minitron.core.tensor_parallel.layers.RowParallelLinear.forward", 5) == \
        "RowParallelLinear.forward"                              # a method keeps its class
    assert fitted_name("torch.distributed.all_reduce", 20) == "dist.all_reduce"


def test_repeated_siblings_merge_with_total_and_each_time():
    t = Trace()
    loop = t.call("minitron.training.training.train")
    for _ in range(8):
        t.call("minitron.core.models.gpt.gpt_model.GPTModel.forward", t.call(SCHEDULES + "forward_step", loop, us=2000))
    text = render(call_tree(t.records, 0, width=120), width=120)
    assert "forward_step ×8  16.0 ms, 2.0 ms each" in text
    assert "GPTModel.forward ×8  8.0 ms, 1.0 ms each" in text    # the children merge too
    assert text.count("forward_step") == 1


def test_calls_of_a_step_whose_group_argument_is_a_list_still_merge():
    t = Trace()
    root = t.call("minitron.training.training.pretrain")
    for _ in range(2):
        t.call("mine.reduce_over", root, group=[0, 1])   # short_value keeps a short list of ints
    assert "reduce_over ×2" in render(call_tree(t.records, 0, width=100), 100)


def test_below_the_depth_a_line_counts_the_calls_with_the_right_noun():
    t = Trace()
    top = t.call("minitron.training.training.pretrain")
    t.call("minitron.training.initialize.initialize_megatron", t.call("minitron.training.training.train", top))
    many = t.call("minitron.training.training.evaluate", top)
    for _ in range(3):
        t.call("minitron.training.training.train_step", many)
    text = render(call_tree(t.records, 0, max_depth=2, width=100), width=100)
    assert "… 1 call below" in text and "… 3 calls below" in text


def test_focus_shows_the_matching_subtrees_under_one_line_of_ancestors():
    text = render(call_tree(training_rank(0), 0, focus="forward_step", width=120), width=120)
    lines = text.splitlines()
    assert lines[1].endswith("pretrain › train › train_step › forward_backward_pipelining_without_interleaving ›")
    assert "forward_step ×2" in lines[2]
    assert "backward_step" not in text and "initialize_model_parallel" not in text
    narrow = render(call_tree(training_rank(0), 0, focus="forward_step", width=60), width=60)
    assert "pretrain › … ›" in narrow.splitlines()[1]            # the middle gives way, not the line
    with pytest.raises(FocusError, match="did you mean train_step"):
        call_tree(training_rank(0), 0, focus="trainstep")


def test_a_deep_tree_keeps_each_call_on_one_line_at_80_columns():
    t = Trace()
    parent = None
    for level in range(9):  # nine levels of long qualified names, then a repeated step
        parent = t.call(f"minitron.core.pipeline_parallel.schedules_interleaved.level_{level}_helper", parent)
    for _ in range(8):
        t.call(SCHEDULES + "forward_step", parent, us=1500)
    text = render(call_tree(t.records, 0), width=80)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert re.search(r"forward_step ×8  12\.0 ms, 1\.5 ms each$", text, re.M), text
    assert all(re.search(rf"level_{n}_helper  1\.0 ms$", text, re.M) for n in range(9)), text


def test_a_check_the_fake_backend_cannot_decide_is_not_ticked():
    runs = {}
    for rank in range(2):
        t = Trace(rank)
        t.call("torch.distributed.init_process_group", backend="fake", world_size=2)
        runs[rank] = t.records
    checks = {c.name: c for c in check_trace(runs)}
    assert checks["same groups, same order"].ok is None
    text = "\n".join(line.plain for line in check_lines(check_trace(runs)))
    assert "– same groups, same order: not run (fake backend" in text
    assert "✓" not in text                                       # nothing here was checked


def test_a_training_trace_shows_its_schedule():
    runs = {rank: training_rank(rank) for rank in range(2)}
    console = Console(width=80, record=True, file=open(os.devnull, "w"), color_system=None)
    show_views(console, runs, {"schedule"}, 0)
    text = console.export_text()
    assert "pipeline schedule of iteration 0" in text
    # stage 0 waits for each gradient from stage 1: the bubble (p - 1) / (m + p - 1) = 1 / 3
    assert "stage 0 F0 F1 ·  B0 ·  B1   33%" in text and "stage 1 ·  F0 B0 F1 B1 ·    33%" in text


def minitron(*argv: str, cwd: Path | None = None, here: bool = False) -> subprocess.CompletedProcess:
    """`minitron ARGV` at 80 columns: the executable, or (``here``) its entry point in this
    process, for the calls after the first (test_view_reads_the_trace_of_a_torchrun_run's, and
    test_trace_reader's refusals, hold the executable)."""
    return run_minitron(*argv, cwd=cwd, env={**os.environ, "COLUMNS": "80", "NO_COLOR": "1"}, here=here)


def test_a_directory_without_rank_files_is_one_line_and_exit_2(tmp_path):
    (tmp_path / "notes.txt").write_text("not a trace")
    proc = minitron("view", str(tmp_path), here=True)
    assert proc.returncode == 2 and not proc.stdout
    assert proc.stderr.count("\n") == 1 and "no rank*.jsonl" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "trace.json").exists()


@pytest.fixture(scope="module")
def torchrun_trace(tmp_path_factory):
    """Two ranks of pretrain_gpt (initialization only) under torchrun, traced by the variable."""
    trace_dir = tmp_path_factory.mktemp("torchrun") / "trace"
    env = {**os.environ, "MINITRON_TRACE_DIR": str(trace_dir), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", "-m", "minitron.pretrain_gpt",
         "--pipeline-model-parallel-size", "2", "--num-layers", "2", "--hidden-size", "32",
         "--num-attention-heads", "4", "--seq-length", "32", "--micro-batch-size", "1",
         "--distributed-backend", "gloo"],
        capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return trace_dir


def test_view_reads_the_trace_of_a_torchrun_run(torchrun_trace):
    proc = minitron("view", str(torchrun_trace), "--rank", "1")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert out.startswith("rank 1\n") and "initialize_model_parallel" in out
    # pp 2 on 2 ranks: one group, [0,1] (an 80-column tree may shorten the name: "…" for GROUP)
    assert "new_group ×1 PIPELINE_MODEL_PARALLEL_" in out
    row = next(line for line in out.splitlines() if line.startswith("│    1 │"))
    assert [cell.strip() for cell in row.split("│")[3:7]] == ["[1]", "[1]", "[0,1]", "[0,1]"]  # tp dp pp embd
    assert "✓ same groups, same order: 2 ranks × " in out and "not run" not in out
    assert "2 ranks (gloo, 2 processes)" in out
    assert max(len(line) for line in out.splitlines()) <= 80
    events = json.loads((torchrun_trace / "trace.json").read_text())["traceEvents"]
    rows = {e["args"]["name"] for e in events if e.get("name") == "process_name"}
    assert rows == {"rank 0 (tp 0, pp 0, dp 0)", "rank 1 (tp 0, pp 1, dp 0)"}


def test_view_focus_folds_the_ancestors_of_a_torchrun_trace(torchrun_trace):
    proc = minitron("view", str(torchrun_trace), "--focus", "initialize_model_parallel", "--show", "tree",
                    here=True)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    # the chain starts at the script's entry; at 80 columns its middle folds into "…"
    assert lines[1].startswith("└── pretrain_gpt.__main__ › ") and lines[1].endswith(" › _initialize_distributed ›")
    assert "initialize_model_parallel" in lines[2] and "new_group" in lines[3]
    missing = minitron("view", str(torchrun_trace), "--focus", "no_such_step", here=True)
    assert missing.returncode == 2 and missing.stderr.count("\n") == 1 and "matches no call" in missing.stderr


def test_a_rank_stopped_mid_write_is_still_read(tmp_path):
    """The recorder writes in blocks, so a killed rank can end in half a line, and the calls it
    had open never got a record: the rest is shown, the orphans marked, the cut line counted."""
    from minitron.trace.reader import read_trace

    t = Trace()
    outer = t.call("minitron.training.training.pretrain")
    inner = t.call("minitron.core.parallel_state.initialize_model_parallel", outer)
    lines = [json.dumps(r) for r in t.records if r is not outer]     # pretrain never returned
    (tmp_path / "rank0.jsonl").write_text("\n".join(lines) + '\n{"rank": 0, "pid": 1')
    runs, cut = read_trace(tmp_path)
    assert cut == [0] and [r["id"] for r in runs[0]] == [inner["id"]]
    assert "initialize_model_parallel  1.0 ms  (its caller never returned)" in render(call_tree(runs[0], 0, width=120), 120)


def test_a_fake_world_hands_back_the_trace_its_files_hold(tmp_path):
    """`minitron trace --backend fake` does not read a thousand files back: the processes that
    played the ranks hand over each rank's records and encoded rows. They must be what the
    files give, and trace.json the same bytes as if it had been written from the files (an
    argument named as an event's own key, "name", included: its row is built the plain way)."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    from minitron.cli.trace import _records_and_rows
    from minitron.cli.views.perfetto import to_chrome, write_chrome_trace
    from minitron.trace.reader import load_trace
    from minitron.launcher.fake import play_ranks
    from minitron.trace import traced
    from minitron.trace.recorder import ENCODE

    @traced(name="minitron.core.parallel_state.initialize_model_parallel")
    def groups():
        for ranks in ([0, 1], [2, 3], [0, 2], [1, 3]):
            dist.new_group(ranks, group_desc="PAIR")
        named("a \"quoted\", \"start_us\": name")

    @traced
    def named(name):
        return name

    def rank_main():
        dist.init_process_group("fake", store=FakeStore(), rank=int(os.environ["RANK"]), world_size=4)
        try:
            groups()
        finally:
            dist.destroy_process_group()

    kept = play_ranks(4, rank_main, tmp_path, processes=2, keep=_records_and_rows)
    runs = load_trace(tmp_path)
    assert list(kept) == [0, 1, 2, 3] and {r: records for r, (records, _) in kept.items()} == runs
    chrome = write_chrome_trace(tmp_path, runs, "fake", encoded={r: rows for r, (_, rows) in kept.items()})
    assert chrome.read_text() == ENCODE(to_chrome(runs, "fake"))
    named_rows = [e for e in json.loads(chrome.read_text())["traceEvents"] if e["name"] == "named"]
    assert len(named_rows) == 4 and named_rows[0]["args"]["name"] == "a \"quoted\", \"start_us\": name"


def test_a_narrow_tree_still_tells_every_group_apart():
    """At the room a deep call-tree line leaves (~24 characters at 80 columns), shortened group
    names stay distinct: the words all names share give way first, marked by "…"."""
    from minitron.cli.views.call_tree import _elide_desc
    from minitron.core.rank_generator import GROUP_KINDS

    descs = [k.desc for k in GROUP_KINDS] + [k.desc + "_GLOO" for k in GROUP_KINDS if k.gloo]
    for room in (24, 28, 32):
        shown = [_elide_desc(d, room) for d in descs]
        assert all(len(s) <= room for s in shown)
        assert len(set(shown)) == len(descs), sorted(shown)
