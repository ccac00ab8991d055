"""The launcher: torchrun's environment, one process per rank, and nothing left behind.

Every rank records its pid and kernel start time first (tests/_rank_probe.py), so the tests
can look in /proc afterwards and tell "gone" from "still running" or "zombie, never reaped".
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from _rank_probe import leftovers, probe, start_children, surviving_children
from minitron.launcher import LaunchConfig, RankFailure, Target, free_port, launch, run_on_ranks, session_env
from minitron.launcher.fake import play_ranks
from minitron.trace import TRACE_DIR_ENV

HERE = Path(__file__).parent
PROBE = str(HERE / "_rank_probe.py")


def ranks_info(out: Path, world: int) -> list[dict]:
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]


def check_env(infos: list[dict], world: int, port: int | None = None) -> None:
    ports = {i["env"]["MASTER_PORT"] for i in infos}
    assert len(ports) == 1 and 0 < int(ports.pop()) < 65536
    for rank, info in enumerate(infos):
        env = info["env"]
        assert env["RANK"] == env["LOCAL_RANK"] == str(rank)          # one node
        assert env["WORLD_SIZE"] == env["LOCAL_WORLD_SIZE"] == str(world)
        assert env["MASTER_ADDR"] == "127.0.0.1"
        assert env["GROUP_RANK"] == "0"                                  # torchrun's node rank
        if port is not None:
            assert env["MASTER_PORT"] == str(port)
    pids = [i["pid"] for i in infos]
    assert len(set(pids)) == world and os.getpid() not in pids


@pytest.fixture
def out(tmp_path):
    """A directory for the ranks' records; afterwards, no rank may be left in any state."""
    yield tmp_path
    assert leftovers(tmp_path, 4) == []


def test_forked_ranks_get_torchruns_environment(out):
    before = dict(os.environ)
    # warm=(): importing torch._dynamo (the default warm-up) sets a variable of its own here.
    launch(LaunchConfig(world_size=4, log_dir=out / "logs", env={"PROBE_EXTRA": "yes"}, warm=()),
           Target(function=lambda: probe(out)))
    infos = ranks_info(out, 4)
    check_env(infos, 4)
    assert {i["env"]["PROBE_EXTRA"] for i in infos} == {"yes"}
    assert {i["ppid"] for i in infos} == {os.getpid()}                  # forked from us
    assert dict(os.environ) == before                                   # the parent is untouched
    for r in range(4):  # each rank's print() lands in its own log, whatever sys.stdout was here
        assert (out / "logs" / f"rank{r}.log").read_text().strip() == f"rank {r} says hello"


def test_spawned_ranks_run_a_script_with_the_same_environment(out):
    """The nccl start method spawns fresh interpreters; the script here touches no GPU."""
    port = free_port()
    launch(LaunchConfig(world_size=4, backend="nccl", master_port=port, log_dir=out / "logs"),
           Target(script=PROBE, argv=[str(out)]))
    infos = ranks_info(out, 4)
    check_env(infos, 4, port)


def test_forked_ranks_run_a_script_target(out):
    launch(LaunchConfig(world_size=4, log_dir=out / "logs"), Target(script=PROBE, argv=[str(out)]))
    check_env(ranks_info(out, 4), 4)


def test_failing_rank_is_named_and_the_others_are_stopped(out):
    logs = out / "logs"
    with pytest.raises(RankFailure) as info:
        launch(LaunchConfig(world_size=4, log_dir=logs), Target(function=lambda: probe(out, "raise")))
    failure = info.value
    assert failure.rank == 2 and failure.exitcode == 1
    assert Path(failure.log_path) == logs / "rank2.log"
    assert "rank 2" in str(failure) and str(logs / "rank2.log") in str(failure)
    # The sleepers were stopped, not waited for: none reached the end of its 120 s sleep,
    # and none exists any more (the fixture checks /proc too).
    assert not list(out.glob("finished*"))
    assert leftovers(out, 4) == []
    # The log the message points to holds the rank's traceback, even when the parent's
    # sys.stderr is not file descriptor 2 (as under pytest, Jupyter or a captured console).
    log = (logs / "rank2.log").read_text()
    assert "Traceback" in log and "ValueError: rank 2 fails on purpose" in log
    assert "rank 2 fails on purpose" in failure.log_tail()


def test_rank_killed_by_a_signal_reports_a_negative_exit_code(out):
    with pytest.raises(RankFailure) as info:
        launch(LaunchConfig(world_size=4, log_dir=out / "logs"),
               Target(function=lambda: probe(out, "kill", culprit=1)))
    assert info.value.rank == 1 and info.value.exitcode == -signal.SIGKILL
    assert "SIGKILL" in str(info.value)
    assert not list(out.glob("finished*"))


@pytest.mark.parametrize("backend", ["gloo", "nccl"])
@pytest.mark.parametrize("mode", ["children", "grandchild"])
def test_processes_a_rank_started_end_with_the_run(out, backend, mode):
    # Forked (gloo) and spawned (nccl: the ranks run no NCCL here) ranks each start a `sleep`
    # and a daemon multiprocessing child; then all exit 0 ("children"), or rank 3 raises
    # ("grandchild"). Before, the 8 children of a run that succeeded all outlived it.
    target = (Target(function=lambda: probe(out, mode, culprit=3)) if backend == "gloo"
              else Target(script=PROBE, argv=[str(out), mode]))   # the script's culprit: rank 2
    cfg = LaunchConfig(world_size=4, backend=backend, log_dir=out / "logs")
    if mode == "children":
        launch(cfg, target)
    else:
        with pytest.raises(RankFailure):
            launch(cfg, target)
    assert surviving_children(out, 4) == [], "(rank, pid) of processes that outlived their rank"


@pytest.mark.parametrize("fails", [False, True])
def test_processes_a_fake_rank_started_end_with_the_play(tmp_path, fails):
    def rank_main():
        rank = int(os.environ["RANK"])
        start_children(tmp_path, rank)
        if fails and rank == 3:
            raise ValueError("rank 3 breaks")

    if fails:
        with pytest.raises(RuntimeError, match="1 of the 2 processes"):
            play_ranks(4, rank_main, processes=2)
    else:
        play_ranks(4, rank_main, processes=2)
    assert surviving_children(tmp_path, 4) == []


def _launch_sleepers(out: Path, write_fd: int) -> None:
    """The Ctrl-C test's parent: a fork of this process (torch loaded already, where a fresh
    interpreter would pay ~1.7 s of CPU to import it) that launches 4 sleeping ranks and, as
    Python does for an uncaught exception, prints the traceback and exits 1."""
    import traceback

    os.dup2(write_fd, 1)
    os.dup2(write_fd, 2)
    os.close(write_fd)
    sys.stdout, sys.stderr = open(1, "w", closefd=False), open(2, "w", closefd=False)
    # Python's own Ctrl-C (a suite run as a background job ignores SIGINT, and forks inherit that)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    try:
        # warm=(): the sleeping ranks never reach an optimizer, so torch._dynamo (the default
        # warm-up) would be imported for nothing.
        launch(LaunchConfig(world_size=4, log_dir=out / "logs", warm=()), Target(function=lambda: probe(out, "sleep")))
    except BaseException:
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def test_ctrl_c_in_the_parent_stops_every_rank(out):
    read_fd, write_fd = os.pipe()
    parent = os.fork()
    if parent == 0:
        os.close(read_fd)
        try:
            _launch_sleepers(out, write_fd)
        finally:
            os._exit(3)   # never back into pytest from the fork
    os.close(write_fd)
    status = None

    def ended() -> bool:
        nonlocal status
        if status is None:
            pid, waited = os.waitpid(parent, os.WNOHANG)
            status = waited if pid else None
        return status is not None

    try:
        deadline = time.monotonic() + 60
        while not all((out / f"rank{r}.json").exists() for r in range(4)):
            assert not ended(), "the parent ended before its ranks started"
            assert time.monotonic() < deadline, "ranks never started"
            time.sleep(0.05)
        os.kill(parent, signal.SIGINT)
        deadline = time.monotonic() + 60
        while not ended() and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        if not ended():   # never leave it behind, whatever failed
            os.kill(parent, signal.SIGKILL)
            os.waitpid(parent, 0)
        # What it printed is all in the pipe now; read without waiting for an EOF a stray
        # rank holding the pipe would withhold.
        os.set_blocking(read_fd, False)
        printed = b""
        with contextlib.suppress(BlockingIOError):
            while chunk := os.read(read_fd, 1 << 16):
                printed += chunk
        os.close(read_fd)
    code = os.waitstatus_to_exitcode(status) if status is not None else None
    assert code not in (0, None), printed.decode(errors="replace")
    assert b"KeyboardInterrupt" in printed
    # The parent is gone, so any rank still here would be an orphan (or an unreaped zombie).
    assert leftovers(out, 4) == []
    assert not list(out.glob("finished*"))


# --- the harness: a Python function on every rank, its results back ------------------------

def test_run_on_ranks_brings_back_each_ranks_result_in_rank_order():
    import torch.distributed as dist

    results = run_on_ranks(lambda rank: (rank, dist.get_rank(), dist.get_world_size(), os.getpid()),
                           LaunchConfig(world_size=3, warm=()))
    assert [r[:3] for r in results] == [(0, 0, 3), (1, 1, 3), (2, 2, 3)]   # inside the world
    assert len({r[3] for r in results} | {os.getpid()}) == 4                # one process each


def _fail_on_rank_one(rank: int) -> None:
    print(f"rank {rank} before the failure")
    assert rank != 1, "rank one refuses"


def test_a_failing_rank_keeps_its_log_tail_after_the_scratch_directory_is_gone():
    with pytest.raises(RankFailure) as caught:
        run_on_ranks(_fail_on_rank_one, LaunchConfig(world_size=2, warm=()))
    assert caught.value.rank == 1 and not caught.value.log_path.exists()
    assert "AssertionError: rank one refuses" in caught.value.log_tail()


def test_session_env_turns_on_tracing_and_the_debugger_and_rejects_a_bad_request(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert session_env(4) == {}
    env = session_env(4, trace_dir="t", debug_ranks="1-2", debug_port_base=7000)
    assert env[TRACE_DIR_ENV] == str(tmp_path / "t")          # absolute: ranks may chdir
    assert env["MINITRON_DEBUG_RANKS"] == "1,2" and env["MINITRON_DEBUG_PORT_BASE"] == "7000"
    with pytest.raises(ValueError, match="not in this world of 4"):
        session_env(4, debug_ranks="4")


# --- the fake backend's rules, which live in the launcher, not in the tracer ----------------

def test_a_fake_world_answers_non_members_unrecorded_and_makes_every_group_fake(tmp_path):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    torchs_own = dist.new_group
    kept = {}

    def rank_main():
        rank = int(os.environ["RANK"])
        dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=4)
        try:
            pairs = [dist.new_group([0, 1], group_desc="PAIR"), dist.new_group([2, 3], group_desc="PAIR")]
            twin = dist.new_group([0, 1, 2, 3], backend="gloo", group_desc="TWIN")  # no gloo in a fake world
            kept[rank] = ([dist.get_process_group_ranks(g) if g is not dist.GroupMember.NON_GROUP_MEMBER
                           else None for g in pairs], dist.get_process_group_ranks(twin))
        finally:
            dist.destroy_process_group()

    play_ranks(4, rank_main, tmp_path, processes=1)  # here, so that `kept` is filled in this process
    assert dist.new_group is torchs_own                                     # rules gone afterwards
    assert kept[0] == ([[0, 1], None], [0, 1, 2, 3]) and kept[3] == ([None, [2, 3]], [0, 1, 2, 3])
    for rank in range(4):
        records = [json.loads(line) for line in (tmp_path / f"rank{rank}.jsonl").read_text().splitlines()]
        groups = [r["args"] for r in records if r["name"] == "torch.distributed.new_group"]
        assert [g["ranks"] for g in groups] == [[0, 1] if rank < 2 else [2, 3], [0, 1, 2, 3]]
        assert groups[1]["backend"] == "gloo" and all(g["member"] for g in groups)  # what was asked


def test_a_fake_world_played_by_two_processes_leaves_the_same_traces(tmp_path):
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    def rank_main():
        dist.init_process_group("fake", store=FakeStore(), rank=int(os.environ["RANK"]), world_size=4)
        try:
            for ranks in ([0, 1], [2, 3], [0, 2], [1, 3]):
                dist.new_group(ranks, group_desc="PAIR")
        finally:
            dist.destroy_process_group()

    def calls(where):
        return [[{k: v for k, v in json.loads(line).items() if k not in ("pid", "start_us", "end_us")}
                 for line in (where / f"rank{r}.jsonl").read_text().splitlines()] for r in range(4)]

    play_ranks(4, rank_main, tmp_path / "one", processes=1)
    play_ranks(4, rank_main, tmp_path / "two", processes=2)
    assert calls(tmp_path / "one") == calls(tmp_path / "two")
    pids = {json.loads((tmp_path / "two" / f"rank{r}.jsonl").read_text().splitlines()[0])["pid"] for r in range(4)}
    # Forked copies played them; which copy took how many is the dealing's affair (tested below).
    assert 1 <= len(pids) <= 2 and os.getpid() not in pids


def test_every_rank_of_a_fake_world_is_dealt_once_to_whichever_copy_is_free(tmp_path):
    # Seven ranks, three copies. Rank 0 does not finish until every other rank has been played:
    # dealt in fixed thirds (0, 3, 6 to one copy) it would wait for ranks of its own copy; dealt
    # to whichever copy is free, the other two copies take all six meanwhile.
    def rank_main():
        rank = int(os.environ["RANK"])
        if rank == 0:
            deadline = time.monotonic() + 30
            while len(list(tmp_path.glob("played*"))) < 6 and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            (tmp_path / f"played{rank}").touch()

    played = play_ranks(7, rank_main, tmp_path / "trace", processes=3, keep=lambda rank, records, lines: os.getpid())
    assert sorted(played) == list(range(7)) and os.getpid() not in played.values()
    assert len(list(tmp_path.glob("played*"))) == 6
    assert [r for r, pid in played.items() if pid == played[0]] == [0]  # the others played the rest


def test_forked_ranks_collect_cycles_but_never_walk_what_they_inherited(tmp_path):
    import gc

    def rank_main():
        # Written by the rank, read here: the collector is on, and the parent's objects are
        # frozen (a collection in the rank would otherwise touch, and so copy, their pages).
        where = "fake" if os.environ.get(TRACE_DIR_ENV) else "forked"
        (tmp_path / f"{where}{os.environ['RANK']}").write_text(f"{gc.isenabled()} {gc.get_freeze_count() > 1000}")

    collecting, frozen = gc.isenabled(), gc.get_freeze_count()
    gc.disable()  # as the command line runs: the ranks turn it back on for themselves
    try:
        launch(LaunchConfig(world_size=2, log_dir=tmp_path / "logs", warm=()), Target(function=rank_main))
        play_ranks(2, rank_main, tmp_path / "fake", processes=2)
    finally:
        if collecting:
            gc.enable()
    assert gc.get_freeze_count() == frozen  # the launcher unfroze this process's objects after forking
    assert [(tmp_path / f"{where}{r}").read_text() for where in ("forked", "fake") for r in range(2)] == ["True True"] * 4


def test_a_fake_world_copy_that_fails_is_named_and_the_others_finish_the_deck(tmp_path, capfd):
    def rank_main():
        if os.environ["RANK"] == "2":
            raise ValueError("rank 2 breaks")
        (tmp_path / f"played{os.environ['RANK']}").touch()

    with pytest.raises(RuntimeError, match="1 of the 2 processes playing the fake world failed"):
        play_ranks(40, rank_main, processes=2)
    assert "ValueError: rank 2 breaks" in capfd.readouterr().err
    # The copy that failed stopped at rank 2; the other took every rank still in the deck.
    assert sorted(int(p.name.removeprefix("played")) for p in tmp_path.glob("played*")) == \
        [r for r in range(40) if r != 2]
