"""What runs inside one rank before the user's program: the per-rank session.

The launcher's forked children call ``run_target`` directly; spawned ranks run
``python -m minitron.launcher.worker [-m MODULE | SCRIPT] ARGS...``; a program started by
torchrun calls ``rank_session()`` itself (pretrain_gpt.main does). All three read the same
environment variables, so tracing works the same however the rank was started.
"""

from __future__ import annotations

import os
import runpy
import sys
import time
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

from minitron import trace
from minitron.launcher import debug
from minitron.launcher.hang_watch import watch_progress
from minitron.launcher.runner import bind_cores_from_env
from minitron.trace import dump


ERROR_DIR_ENV = "MINITRON_ERROR_DIR"


@dataclass
class Target:
    """What each rank runs: a module (``-m``), a script path, or (fork only) a Python callable."""

    module: str | None = None
    script: str | None = None
    argv: list[str] = field(default_factory=list)
    function: Callable[[], object] | None = None

    def command(self) -> list[str]:
        """The command line of a spawned rank: this module, told what to run."""
        what = ["-m", self.module] if self.module else [self.script]
        return [sys.executable, "-u", "-m", "minitron.launcher.worker", *what, *self.argv]


def session_env(world_size: int, trace_dir: str | os.PathLike | None = None, debug_ranks: str | None = None,
                debug_port_base: int = debug.DEFAULT_PORT_BASE, debug_host: str = debug.DEFAULT_HOST,
                debug_wait_timeout: float = debug.DEFAULT_WAIT_TIMEOUT) -> dict[str, str]:
    """The variables that switch on ``rank_session``'s features: tracing into ``trace_dir``,
    a debugger for ``debug_ranks``. Built once, in the launcher; ValueError on a bad request."""
    env = {trace.TRACE_DIR_ENV: str(Path(trace_dir).resolve())} if trace_dir else {}
    if debug_ranks:
        env.update(debug.debug_env(debug_ranks, world_size, debug_port_base, debug_host, debug_wait_timeout))
    return env


# What gloo raises in a rank whose peer has gone: the symptom of another rank's failure.
PEER_LOST = ("Connection reset by peer", "Connection closed by peer", "Broken pipe")


def record_failure(exc: BaseException | None = None) -> None:
    """Note when this rank's program raised, and whether it raised because a peer had gone,
    for the launcher to find who failed first."""
    where = os.environ.get(ERROR_DIR_ENV)
    if where:
        lost = exc is not None and any(words in str(exc) for words in PEER_LOST)
        try:
            with open(os.path.join(where, f"rank{env_rank()}"), "w") as f:
                f.write(repr(time.time()) + (" peer-lost" if lost else ""))
        except OSError:
            pass


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


@contextmanager
def rank_session():
    """Start tracing if MINITRON_TRACE_DIR is set, wait for a debugger if this rank is in
    MINITRON_DEBUG_RANKS, and flush the trace however the rank ends.

    Nested use is harmless: only the outermost session starts and stops the recorder.
    """
    bind_cores_from_env()   # `launch --bind_cores_to_rank`: this rank's share of the cores
    trace_dir = os.environ.get(trace.TRACE_DIR_ENV)
    owner = bool(trace_dir) and trace.active() is None
    if owner:
        recorder = trace.start(trace_dir, env_rank())
        # Asked by the launcher's hang watch (or `kill -USR2`), the rank writes where it is;
        # under a watch it also stamps each call's end where the watch sees it (hang_watch.py).
        dump.install(recorder, trace_dir)
        watch_progress(recorder)
    try:
        debug.wait_for_debugger_if_asked(env_rank())  # before pretrain, as the seed note does by hand
        yield
    finally:
        if owner:
            trace.stop()


def run_target(target) -> int:
    """Run a launcher Target in this process, inside a rank session; return its exit code."""
    try:
        code = _run(target)
    except BaseException as exc:
        if not isinstance(exc, SystemExit) or exc.code not in (0, None):
            record_failure(exc)
        raise
    if code:
        record_failure()
    return code


def _run(target) -> int:
    with rank_session():
        if target.function is not None:
            result = target.function()
            return result if isinstance(result, int) else 0
        name = target.module or target.script
        sys.argv = [name, *target.argv]
        try:
            if target.module:
                # The launcher imported the module in the parent to warm it; runpy warns that
                # it is re-running an imported module, which is exactly what we want.
                warnings.filterwarnings("ignore", message=".*found in sys.modules", category=RuntimeWarning)
                runpy.run_module(target.module, run_name="__main__", alter_sys=True)
            else:
                sys.path.insert(0, os.path.dirname(os.path.abspath(target.script)))
                runpy.run_path(target.script, run_name="__main__")
        except SystemExit as exc:
            return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "-m":
        target = Target(module=argv[1], argv=argv[2:])
    else:
        target = Target(script=argv[0], argv=argv[1:])
    return run_target(target)


if __name__ == "__main__":
    sys.exit(main())
