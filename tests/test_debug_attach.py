"""--debug for real: a debugger attaches to one rank of a running job, and nothing is left behind.

The client is tests/dap_client.py, speaking the same protocol VS Code speaks. The attach job is
the real command line (``minitron trace ... --debug R``) in a subprocess, so what is tested is
what a user runs: forked gloo ranks, per-rank logs, the "waiting" line on the launcher's
terminal. The timeout job is the same command line through its entry point in this process,
and the taken-port and spawned-rank jobs call the launcher from this process, which saves a
torch start-up each.

"Nothing left behind" is checked by pid: while a job runs we note its rank processes and the
debugpy adapter processes listening on its ports (each with its kernel start time, so a reused
pid is not mistaken for ours); after it ends, none of them may exist in any form.
"""

from __future__ import annotations

import inspect
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from _rank_probe import start_time, state
from cli_here import minitron_here
from dap_client import DapClient
from minitron.core import parallel_state
from minitron.launcher import LaunchConfig, RankFailure, Target, free_port, launch
from minitron.launcher.debug import debug_env

MINITRON = [sys.executable, "-m", "minitron"]
HERE = Path(__file__).parent


# -- processes --------------------------------------------------------------------------------
def _read(path: str) -> bytes:
    # os.open/os.read, not pathlib: the Watcher below reads every process's files 50 times a
    # second, and pathlib's objects and text decoding were most of its CPU.
    fd = os.open(path, os.O_RDONLY)
    try:
        return os.read(fd, 1 << 16)
    finally:
        os.close(fd)


def _procs():
    """(pid, argv, ppid) of every process we can read."""
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                argv = _read(f"/proc/{name}/cmdline").decode(errors="replace").split("\0")
                stat = _read(f"/proc/{name}/stat")
            except OSError:
                continue
            yield int(name), argv, int(stat[stat.rfind(b")") + 2:].split()[1])


def _argv(pid: int) -> str:
    """The command line of ``pid``, to name a survivor; '' once it is gone."""
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").replace("\0", " ")[:200]
    except OSError:
        return ""


def _serves(argv: list[str], port: int) -> bool:
    """Is ``argv`` a debugpy adapter serving clients on ``port``?"""
    return (any("debugpy" in a for a in argv) and "--port" in argv
            and argv[argv.index("--port") + 1:][:1] == [str(port)])


def adapters(port: int, procs=None) -> list[int]:
    """debugpy adapter processes serving clients on ``port`` (among ``procs``: one scan's)."""
    return [pid for pid, argv, _ in (procs if procs is not None else _procs()) if _serves(argv, port)]


def children(pid: int, procs=None) -> list[int]:
    return [p for p, _, ppid in (procs if procs is not None else _procs()) if ppid == pid]


# What each process identified was running when first seen: a survivor is named by it even
# when it is a zombie, or gone, by the time it is reported.
_SEEN_AS: dict[tuple[int, str], str] = {}


def identities(pids) -> dict[int, str]:
    found = {pid: start_time(pid) for pid in pids if start_time(pid)}
    for pid, started in found.items():
        _SEEN_AS.setdefault((pid, started), _argv(pid))
    return found


# How long a debugpy adapter may take to go once its rank has: a moment, but under load (two
# busy loops and other jobs on 2 cores) it took ~15 s in 2 runs of 40, so the bound is generous.
# It is a deadline, not a timing: a run that is quicker returns at once.
GONE_WITHIN = 60.0


def survivors(ids: dict[int, str], timeout: float = GONE_WITHIN) -> list[str]:
    """Which of ``ids`` still exist (zombies too), after giving them ``timeout`` s to go:
    an adapter notices its rank is gone when the socket closes, a moment after the job."""
    deadline = time.monotonic() + timeout
    while True:
        left = [f"pid {pid} state {state(pid)}: {_SEEN_AS.get((pid, t), '')}" for pid, t in ids.items()
                if start_time(pid) == t]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.05)


class Watcher:
    """Notes, every 20 ms from the moment it starts, the children of ``root`` and the adapters
    serving ``port``: a process that lives a few seconds is seen even when this machine is so
    busy that a test reads the job's output late (looking once, afterwards, would miss it)."""

    def __init__(self, root: int, port: int, exclude=()):
        self.children: dict[int, str] = {}
        self.adapters: dict[int, str] = {}   # with the short-lived first one that daemonizes
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(root, port, set(exclude)), daemon=True)
        self._thread.start()

    def _watch(self, root: int, port: int, exclude: set) -> None:
        while not self._done.is_set():
            procs = list(_procs())   # one scan of /proc for both questions
            self.children.update(identities(p for p in children(root, procs) if p not in exclude))
            self.adapters.update(identities(adapters(port, procs)))
            time.sleep(0.02)

    def stop(self) -> dict[int, str]:
        """Stop watching; every process seen."""
        self._done.set()
        self._thread.join()
        return {**self.children, **self.adapters}


def no_adapter(port: int, timeout: float = GONE_WITHIN) -> bool:
    """True once no adapter serves ``port`` (for jobs whose adapters we could not watch start)."""
    deadline = time.monotonic() + timeout
    while adapters(port):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def quiet_ports() -> int:
    """A port P with P and P + 1 free (the ports of ranks 0 and 1): the launcher's free_port,
    which draws below Linux's ephemeral range, where nobody's outgoing connections land (a free
    ephemeral port can be handed to another job's connection between our check and the rank's
    listen: under load, with other jobs' gloo links opening, that failed a run in 20), and draws
    with SystemRandom (this module's `random` may have been seeded by an earlier test in the
    same worker, alike in every worker, and two workers then drew the same ports)."""
    return free_port(count=2)


# -- jobs -------------------------------------------------------------------------------------
class Job:
    """``minitron trace --world 2 ...`` in a subprocess, its terminal output in a file."""

    def __init__(self, tmp: Path, *args: str):
        self.out = tmp / "terminal.txt"
        env = {**os.environ, "COLUMNS": "200", "NO_COLOR": "1"}  # one line stays one line
        self.proc = subprocess.Popen([*MINITRON, "trace", "--world", "2", "--out", str(tmp / "trace"), *args],
                                     stdout=self.out.open("w"), stderr=subprocess.STDOUT, env=env)

    def text(self) -> str:
        return self.out.read_text()

    def wait_for(self, needle: str, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.text():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.proc.kill()
                pytest.fail(f"no {needle!r} from the job; it printed:\n{self.text()}")
            time.sleep(0.02)

    def finish(self, timeout: float = 60.0) -> int:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            pytest.fail(f"the job did not end; it printed:\n{self.text()}")


def breakpoint_line() -> tuple[str, int]:
    """A line inside initialize_model_parallel, just after the rank has read its own number."""
    func = inspect.unwrap(parallel_state.initialize_model_parallel)
    lines, first = inspect.getsourcelines(func)
    offset = next(i for i, text in enumerate(lines) if "world_size = torch.distributed.get_world_size()" in text)
    return str(Path(inspect.getsourcefile(func)).resolve()), first + offset


# -- tests ------------------------------------------------------------------------------------
def test_attach_to_rank_1_break_in_initialize_model_parallel_and_finish(tmp_path):
    port = quiet_ports() + 1
    job = Job(tmp_path, "--debug", "1", "--debug-port-base", str(port - 1), "--debug-wait-timeout", "60")
    job.wait_for(f"rank 1: waiting for a debugger on 127.0.0.1:{port}")
    watched = identities(children(job.proc.pid) + adapters(port))
    assert len(watched) == 4  # two ranks, the rendezvous-store keeper and rank 1's adapter

    path, line = breakpoint_line()
    client = DapClient.connect("127.0.0.1", port)
    try:
        client.request("initialize", clientID="minitron-tests", adapterID="debugpy", pathFormat="path",
                       linesStartAt1=True, columnsStartAt1=True)
        attach = client.send("attach", justMyCode=False)  # answered only after configurationDone
        client.event("initialized")
        placed = client.request("setBreakpoints", source={"path": path}, breakpoints=[{"line": line}])
        assert placed["body"]["breakpoints"][0]["verified"]
        client.request("configurationDone")
        client.response(attach)

        stopped = client.event("stopped", timeout=60)["body"]
        assert stopped["reason"] == "breakpoint"
        thread = stopped["threadId"]
        frame = client.request("stackTrace", threadId=thread, levels=1)["body"]["stackFrames"][0]
        assert (frame["name"], frame["line"]) == ("initialize_model_parallel", line)

        def evaluate(expression: str) -> str:
            return client.request("evaluate", expression=expression, frameId=frame["id"],
                                  context="repl")["body"]["result"]

        # State only rank 1 has: its global rank, and the module global it has just set.
        assert evaluate("torch.distributed.get_rank()") == "1"
        assert evaluate("_RANK") == "1"
        assert evaluate("tensor_model_parallel_size") == "1"  # a local of the paused frame
        client.request("continue", threadId=thread)
        client.request("disconnect")
    finally:
        client.close()

    assert job.finish() == 0, job.text()
    assert job.text().count("waiting for a debugger") == 1  # exactly one line, from rank 1 only
    assert survivors(watched) == []


def test_nobody_attaches_within_the_wait_timeout(tmp_path, capfd):
    """The same command line through its entry point in this process (the attach test above
    runs the executable): its ranks fork from here, and the rank's "waiting" line reaches this
    process's file descriptor 2, which capfd reads."""
    port = quiet_ports() + 1
    before = set(children(os.getpid()))  # not this command's (the suite's site build, say)
    # Watched from the start: rank 1 gives up 2 s after its "waiting" line.
    watcher = Watcher(os.getpid(), port, exclude=before)
    try:
        done = minitron_here("trace", "--world", "2", "--out", str(tmp_path / "trace"), "--debug", "1",
                             "--debug-port-base", str(port - 1), "--debug-wait-timeout", "2",
                             env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})
    finally:
        watched = watcher.stop()
    assert done.returncode != 0
    # Two ranks and the rendezvous keeper, and the adapter; and, when it lives long enough to be
    # seen, the child that clears --out of a previous run (cli/trace_out.py). Whatever was seen
    # must be gone at the end (below).
    assert len(watcher.children) in (3, 4) and watcher.adapters
    text = done.stdout + done.stderr + capfd.readouterr().err
    assert f"rank 1: waiting for a debugger on 127.0.0.1:{port}" in text
    assert f"no debugger attached within 2 s on 127.0.0.1:{port}" in text
    assert "rank 1 exited with code 1" in text  # the launcher names the rank and stopped rank 0
    assert survivors(watched) == []
    assert no_adapter(port)


def test_a_taken_port_names_the_rank_and_the_port(tmp_path):
    """Rank 1's port is taken; rank 0 (also asked to wait) is listening when the launcher stops
    it, so this also checks that a stopped rank takes its adapter with it. The launcher runs in
    this process (forked ranks, no CLI start-up); a thread notes every process as it appears."""
    before = set(children(os.getpid()))  # not this launch's (the suite's site build, say)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", quiet_ports() + 1))   # rank 1's; rank 0's is free
        squatter.listen()
        taken = squatter.getsockname()[1]
        watcher = Watcher(os.getpid(), taken - 1, exclude=before)
        # A long grace: rank 0 holds SIGTERM until its adapter's handshake is done (see
        # debug.py), which takes seconds on a loaded machine; SIGKILLed before, it leaves the
        # adapter waiting for it (a run in 20 under load did, with the default 3 s).
        cfg = LaunchConfig(world_size=2, log_dir=tmp_path / "logs", grace_seconds=60,
                           env=debug_env("all", 2, taken - 1, "127.0.0.1", 60))
        try:
            with pytest.raises(RankFailure) as failure:
                launch(cfg, Target(function=lambda: 0))
        finally:
            seen = watcher.stop()
    assert failure.value.rank == 1
    assert failure.value.log_tail() == (f"rank 1: port {taken} on 127.0.0.1 is already in use, so the debugger "
                                        f"cannot listen there; free it or pick another --debug-port-base "
                                        f"(MINITRON_DEBUG_PORT_BASE)")
    # The rendezvous keeper and rank 0 (alive until the launcher stops it), rank 1 if it lived
    # long enough to be seen, rank 0's adapter if it got that far before the stop.
    assert len(seen) >= 2
    assert survivors(seen) == []
    assert no_adapter(taken - 1)


def test_spawned_ranks_wait_too_and_say_so_on_the_launchers_terminal(tmp_path, capfd):
    """The nccl start method spawns fresh interpreters (this script touches no GPU). Their
    output goes to logs, yet the "waiting" line reaches our stderr through the launcher."""
    port = quiet_ports() + 1
    env = debug_env("1", 2, port - 1, "127.0.0.1", 1.0)
    cfg = LaunchConfig(world_size=2, backend="nccl", log_dir=tmp_path / "logs", env=env)
    with pytest.raises(RankFailure) as failure:
        launch(cfg, Target(script=str(HERE / "_rank_probe.py"), argv=[str(tmp_path / "probe"), "sleep"]))
    assert failure.value.rank == 1
    assert f"rank 1: waiting for a debugger on 127.0.0.1:{port}" in capfd.readouterr().err
    log = (tmp_path / "logs" / "rank1.log").read_text()
    assert f"rank 1: no debugger attached within 1 s on 127.0.0.1:{port}" in log
    assert no_adapter(port)
