"""Faults while running (issue #11): the right rank is blamed, the rendezvous listens on the
master address only, a killed launcher leaves no scratch folder, Ctrl-C stops preprocess."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest

from minitron.launcher import LaunchConfig, RankFailure, Target, launch
from cli_here import MINITRON



def _die_after_barrier(how: str) -> int:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 2:
        if how == "segv":
            import faulthandler
            faulthandler.disable()  # pytest's handler would print a dump; a real crash need not
            os.kill(os.getpid(), signal.SIGSEGV)
        os._exit(3)
    dist.all_reduce(torch.ones(4))  # the others block here, then lose their peer
    return 0


@pytest.mark.parametrize("how, words", [("segv", "rank 2 was killed by SIGSEGV"), ("exit", "rank 2 exited with code 3")])
def test_the_rank_that_died_is_blamed_not_a_bystander(how, words, tmp_path):
    # Before: a bystander whose log said "Connection reset by peer" was named, 11 runs of 11.
    for run in range(3):
        with pytest.raises(RankFailure) as failure:
            launch(LaunchConfig(world_size=4, log_dir=tmp_path / f"logs{run}"),
                   Target(function=lambda: _die_after_barrier(how)))
        assert str(failure.value).startswith(words), str(failure.value)


def _listening(port: int) -> list[str]:
    """Local addresses listening on ``port``, read from /proc/net/tcp{,6} (state 0A: LISTEN)."""
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            local, state = row.split()[1], row.split()[3]
            if state == "0A" and int(local.split(":")[1], 16) == port:
                found.append(local.split(":")[0])
    return found


def test_the_rendezvous_listens_on_the_master_address_only(tmp_path):
    def body() -> int:
        if os.environ["RANK"] == "0":
            (tmp_path / "listen.json").write_text(json.dumps(_listening(int(os.environ["MASTER_PORT"]))))
        return 0
    launch(LaunchConfig(world_size=2), Target(function=body))
    # 127.0.0.1, little-endian hex; before it was "::" (every interface, IPv4 and IPv6).
    assert json.loads((tmp_path / "listen.json").read_text()) == ["0100007F"]


def _wait_for(predicate, timeout=60.0):
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def test_a_killed_launcher_leaves_no_scratch_folder(tmp_path):
    scratch = tmp_path / "tmpdir"
    scratch.mkdir()
    script = tmp_path / "sleep.py"
    script.write_text(f"import os, time\nopen(r'{tmp_path}/up' + os.environ['RANK'], 'w')\ntime.sleep(60)\n")
    # The launcher is a fork of this process (torch loaded: a fresh `minitron launch` would
    # import it again, ~1.2 s of CPU), with TMPDIR pointing at the scratch as the user's would.
    launcher = os.fork()
    if launcher == 0:
        try:
            import tempfile

            os.environ["TMPDIR"] = str(scratch)
            tempfile.tempdir = None   # read TMPDIR again: this process had its answer cached
            launch(LaunchConfig(world_size=2, log_dir=tmp_path / "logs", warm=()), Target(script=str(script)))
        finally:
            os._exit(1)   # never back into pytest from the fork
    try:
        _wait_for(lambda: (tmp_path / "up0").exists() and (tmp_path / "up1").exists())
        assert any(p.name.startswith("minitron-errors-") for p in scratch.iterdir())  # it was there
    finally:
        os.kill(launcher, signal.SIGKILL)
        os.waitpid(launcher, 0)
    _wait_for(lambda: not list(scratch.iterdir()), timeout=10)


def test_ctrl_c_stops_preprocess_workers_and_cleans_up(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    line = json.dumps({"text": "the same words again and again " * 20}) + "\n"
    corpus.write_text(line * 150_000)  # ~100 MB: seconds of work for two workers
    out = tmp_path / "out"
    proc = subprocess.Popen([MINITRON, "preprocess", "--input", str(corpus), "--output-prefix", str(out),
                             "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True,
                            # a suite run as a background job ignores SIGINT, and its children inherit
                            # that: give this one a terminal's default, as test_cli_flags does
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    _wait_for(lambda: any(".bin.tmp" in p.name for p in tmp_path.iterdir()) or proc.poll() is not None)
    time.sleep(0.5)  # the workers are tokenizing now
    assert proc.poll() is None, "finished before it could be interrupted: make the corpus larger"
    os.killpg(proc.pid, signal.SIGINT)  # what the terminal does: the whole foreground group
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert err.strip().splitlines() == ["minitron: interrupted"], err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.jsonl"]  # no .bin.tmpPID left
    left = subprocess.run(["pgrep", "-g", str(proc.pid)], capture_output=True, text=True).stdout.split()
    assert left == [], f"workers still alive: {left}"


def test_a_bystander_seen_first_is_not_blamed_when_it_only_lost_its_peer(tmp_path):
    # A busy machine can let the launcher see rank 1 (which raised "Connection reset by peer")
    # die before rank 2 (gone by os._exit, so silent). Rank 1's own words clear it.
    from types import SimpleNamespace

    from minitron.launcher.failures import first_failure

    class Seen:  # when the launcher saw the deaths (time.time()): rank 1 first
        seen = {1: 100.5, 2: 100.7}

        def wait(self, timeout):
            pass

    procs = [SimpleNamespace(returncode=code, poll=lambda code=code: code) for code in (0, 1, 3)]
    (tmp_path / "rank1").write_text("100.0 peer-lost")
    assert first_failure(procs, tmp_path, Seen(), settle=0) == (2, 3)
    (tmp_path / "rank1").write_text("100.0")  # raised for a reason of its own: it came first
    assert first_failure(procs, tmp_path, Seen(), settle=0) == (1, 1)


def _raise_then_a_peer_is_killed() -> int:
    rank = int(os.environ["RANK"])
    if rank == 0:
        raise ValueError("the real failure")
    if rank == 1:  # killed from outside a moment later (the OOM killer, a user): once rank 0 has raised
        stamp = Path(os.environ["MINITRON_ERROR_DIR"]) / "rank0"
        while not stamp.exists():
            time.sleep(0.001)
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(60)
    return 0


def test_a_rank_killed_after_another_raised_is_not_named(tmp_path):
    # Before: rank 1 was named, as a rank killed by a signal always was ("peers fail by raising").
    with pytest.raises(RankFailure) as failure:
        launch(LaunchConfig(world_size=4, log_dir=tmp_path / "logs"),
               Target(function=_raise_then_a_peer_is_killed))
    assert (failure.value.rank, failure.value.exitcode) == (0, 1), str(failure.value)


def _leave_early() -> int:
    import torch
    import torch.distributed as dist
    dist.init_process_group("gloo")
    dist.barrier()
    if dist.get_rank() == 0:
        return 0  # done, as far as rank 0 knows: it leaves, and takes its connections with it
    time.sleep(0.2)
    dist.all_reduce(torch.ones(4))  # the others lose their peer here
    return 0


def test_a_rank_that_exits_0_before_its_peers_are_done_is_named(tmp_path):
    # Before: one of the bystanders was named (rank 3 most often), as only failures counted.
    with pytest.raises(RankFailure) as failure:
        launch(LaunchConfig(world_size=4, log_dir=tmp_path / "logs"), Target(function=_leave_early))
    assert (failure.value.rank, failure.value.exitcode) == (0, 0), str(failure.value)
    assert str(failure.value).startswith("rank 0 exited with code 0 while the other ranks still needed it")
