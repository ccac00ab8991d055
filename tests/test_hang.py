"""Issue 41: a hung job is noticed, diagnosed in one screen, and stopped; `view --hang` reads it back.

Each of the chapter's five hang scripts (docs/examples/hang_*.py) runs once per module on forked
gloo ranks under a 1 s hang timeout, through launcher.launch (the ranks fork from this process,
which already holds torch): the diagnosis the launcher hands to the screen is kept, with how long
after the timeout it came. The command line's entry point runs one case end to end (`minitron
launch --hang-timeout`, then `minitron view --hang`), and the recorder's open records are checked to
leave complete traces as they were.
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import pytest

from rich.console import Console

from cli_here import run_minitron
from minitron.cli.views.hang import show_hang
from minitron.launcher import JobHung, LaunchConfig, Target, launch
from minitron.trace import TRACE_DIR_ENV
from minitron.trace.reader import read_in_flight, read_trace

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
TIMEOUT = 1.0
WORLDS = {"skip": 4, "order": 2, "send": 2, "new_group": 4, "compute": 4}


def run_hang(case: str, out: Path) -> dict:
    """Launch docs/examples/hang_CASE.py; the diagnosis, the screen, the ranks that did not answer,
    and the seconds from the timeout (the last traced call's end + TIMEOUT) to the screen's end."""
    seen = {}

    def on_hang(trace_dir, silent, timeout):   # the screen the command line prints, into a string
        screen = Console(file=io.StringIO(), width=200)
        seen.update(diagnosis=show_hang(screen, trace_dir, silent, timeout), silent=silent, at=time.time(),
                    screen=screen.file.getvalue())

    trace_dir = out / case
    cfg = LaunchConfig(world_size=WORLDS[case], log_dir=out / f"{case}-logs", warm=(), hang_timeout=TIMEOUT,
                       env={TRACE_DIR_ENV: str(trace_dir)})
    with pytest.raises(JobHung):
        launch(cfg, Target(script=str(EXAMPLES / f"hang_{case}.py")), on_hang=on_hang)
    runs, _, _ = read_in_flight(trace_dir)
    last_end = max(r["end_us"] for records in runs.values() for r in records) / 1e6
    seen["latency"] = seen["at"] - (last_end + TIMEOUT)
    return seen


@pytest.fixture(scope="module")
def hangs(tmp_path_factory):
    out = tmp_path_factory.mktemp("hangs")
    return {case: run_hang(case, out) for case in WORLDS}


def test_each_hang_is_diagnosed_within_2_s_of_the_timeout_and_every_rank_answers(hangs):
    for case, seen in hangs.items():
        assert seen["silent"] == [], case
        assert 0 <= seen["latency"] < 2.0, (case, seen["latency"])
        pids = {record["pid"] for records in read_in_flight(seen["diagnosis"]["trace_dir"])[0].values()
                for record in records}
        assert pids and not [pid for pid in pids if _alive(pid)], (case, "a rank outlived its hung job")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_skipped_collective_is_the_first_divergence_of_the_group(hangs):
    d = hangs["skip"]["diagnosis"]
    (v,) = d["divergences"]
    assert (v["group"], v["seq"]) == ("WORLD", 3)
    assert v["calls"][0]["call"] == "all_reduce" and v["calls"][0]["ranks"] == [0, 2, 3]
    assert v["calls"][1] == {"call": "barrier", "ranks": [1], "in_flight": True}
    assert "rank 1's 3rd call on WORLD is barrier; ranks 0, 2, 3 " in hangs["skip"]["screen"]


def test_two_groups_in_opposite_orders_are_a_cycle(hangs):
    d = hangs["order"]["diagnosis"]
    stuck = {s["group"]: (s["inside"], s["never_entered"]) for s in d["stuck"]}
    assert stuck == {"GROUP_A": ({"0": "all_reduce"}, [1]), "GROUP_B": ({"1": "all_reduce"}, [0])}
    assert d["cycle"] == [0, 1, 0] and not d["divergences"]


def test_a_send_without_its_receive_names_the_peer(hangs):
    d = hangs["send"]["diagnosis"]
    assert d["point_to_point"] == [{"rank": 0, "call": "send", "direction": "send", "peer": 1,
                                    "peer_matching": False}]
    assert d["where"]["1"]["in"]["name"] == "torch.distributed.barrier"


def test_a_new_group_made_by_some_ranks_only_shows_as_groups_that_differ(hangs):
    d = hangs["new_group"]["diagnosis"]
    (v,) = d["divergences"]
    assert v["group"].startswith("new_group") and v["seq"] == 1
    assert [c["ranks"] for c in v["calls"]] == [[0, 1], [2, 3]] and "PAIR_GROUP" in v["calls"][0]["call"]
    (s,) = d["stuck"]   # every rank entered "ALL_GROUP": they disagree on what it is
    assert s["group"] == "ALL_GROUP" and s["never_entered"] == [] and len(s["inside"]) == 4


def test_a_rank_stuck_in_compute_is_found_in_its_traced_step_with_its_stack(hangs):
    d = hangs["compute"]["diagnosis"]
    (s,) = d["stuck"]
    assert s["never_entered"] == [2] and sorted(s["inside"]) == ["0", "1", "3"]
    where = d["where"]["2"]
    assert where["in"]["name"] == "__main__.forward_step"
    assert where["stack"][-1][2] == "forward_step" and where["stack"][-1][0].endswith("hang_compute.py")
    assert where["flight_recorder"] == "flight_recorder/fr_rank2"


def test_the_flight_recorder_dumps_are_read_with_torchs_loader(hangs, tmp_path_factory):
    from minitron.cli.views.flight_recorder import flight_recorder_lines

    d = hangs["skip"]["diagnosis"]
    lines = flight_recorder_lines(Path(d["trace_dir"]))
    rank1 = next(line for line in lines if line.startswith("  rank 1:"))
    # torch's own record agrees with minitron's: rank 1's 3rd collective on the world is the barrier
    assert "gloo:barrier" in rank1 and "collective #3" in rank1 and "not finished" in rank1


def test_the_finished_calls_of_a_hung_trace_read_as_a_trace(hangs):
    runs, cut = read_trace(hangs["skip"]["diagnosis"]["trace_dir"])
    assert not cut and all(r["name"] != "torch.distributed.barrier" for r in runs[1])  # in flight: not finished


def test_launch_and_view_hang_on_the_command_line(tmp_path):
    trace_dir = tmp_path / "t"
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    # The entry point in this process (its ranks fork from here, torch loaded): the command
    # line's own part, the one-line "hung" and exit code 1, is main()'s; `launch` as an
    # executable is held by test_cli.py and test_cli_flags.py.
    proc = run_minitron("launch", "--world", "2", "--trace", trace_dir, "--hang-timeout", "1",
                        EXAMPLES / "hang_order.py", env=env, here=True)
    assert proc.returncode == 1, proc.stderr
    assert "Deadlock" in proc.stdout and "0 → 1 → 0" in proc.stdout
    assert proc.stderr.startswith("minitron: hung: no rank finished a traced call for 1 s")
    again = run_minitron("view", trace_dir, "--hang", "--json", env=env, here=True)   # starts no rank
    assert again.returncode == 0 and json.loads(again.stdout)["cycle"] == [0, 1, 0]


@pytest.mark.parametrize("argv, says", [
    (["--hang-timeout", "1"], "add --trace DIR"),
    (["--hang-timeout", "0", "--trace", "t"], "positive number of seconds"),
])
def test_a_bad_hang_timeout_is_one_line(tmp_path, argv, says):
    proc = run_minitron("launch", "--world", "2", *argv, EXAMPLES / "hang_order.py", cwd=tmp_path, here=True)
    assert proc.returncode == 2 and says in proc.stderr and proc.stderr.count("\n") == 1


def test_the_flight_recorder_is_turned_on_as_each_backend_needs_and_a_users_variable_wins(tmp_path, monkeypatch):
    from minitron.launcher.hang_watch import flight_recorder_env

    monkeypatch.delenv("TORCH_NCCL_TRACE_BUFFER_SIZE", raising=False)
    monkeypatch.delenv("TORCH_NCCL_DUMP_ON_TIMEOUT", raising=False)
    nccl = flight_recorder_env("nccl", tmp_path)
    assert nccl["TORCH_NCCL_DUMP_ON_TIMEOUT"] == "1" and int(nccl["TORCH_NCCL_TRACE_BUFFER_SIZE"]) > 0
    assert nccl["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] == str(tmp_path.resolve() / "flight_recorder" / "fr_rank")
    assert flight_recorder_env("gloo", tmp_path).keys() == {"TORCH_FR_BUFFER_SIZE", "MINITRON_FLIGHT_RECORDER"}
    monkeypatch.setenv("TORCH_NCCL_TRACE_BUFFER_SIZE", "50")
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in flight_recorder_env("nccl", tmp_path)


def test_view_without_hang_reads_the_finished_calls_of_a_hung_trace(hangs):
    env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}
    proc = run_minitron("view", hangs["compute"]["diagnosis"]["trace_dir"], "--show", "tree", env=env, here=True)
    assert proc.returncode == 0 and "forward_step" in proc.stdout
