"""Start one process per rank, give each torchrun's environment, and watch them.

This is the job of DeepSpeed's ``launcher/launch.py`` (and of torchrun's local agent):

* every rank gets RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT,
  so the program it runs cannot tell us from torchrun;
* if one rank fails, the others are stopped at once (a rank waiting in a collective for a dead
  peer would otherwise wait out the distributed timeout, --distributed-timeout-minutes);
* Ctrl-C stops every rank, and nothing is left behind.

Two ways to start a rank:

* **fork** (gloo, CPU): the parent has already imported torch and minitron, so a child starts
  warm. 16 fresh interpreters would each pay the ~2 s torch import; 16 forks share one.
  The parent must not have started torch's thread pool or CUDA before forking.
* **spawn** (nccl, GPU): a fresh interpreter per rank, one GPU each, as DeepSpeed and torchrun
  do, because CUDA cannot be used in a forked child.
"""

from __future__ import annotations

import gc
import importlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
import uuid
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterator

from minitron.launcher.debug import CONSOLE_FD_ENV
from minitron.launcher.failures import DeathOrder, JobHung, RankFailure, first_failure
from minitron.launcher.hang_watch import HangWatch, ask_where, flight_recorder_env
from minitron.launcher.processes import ForkedProcess, stop_process_groups, stop_signals_held
from minitron.launcher.rendezvous import StoreKeeper, die_with_parent
from minitron.launcher.worker import ERROR_DIR_ENV, Target, run_target
from minitron.trace import TRACE_DIR_ENV


@dataclass
class LaunchConfig:
    world_size: int
    backend: str = "gloo"            # gloo -> fork, nccl -> spawn
    master_addr: str = "127.0.0.1"
    master_port: int | None = None   # None: pick a free one
    # Pass ``--local_rank=N`` to each rank's program, before its own arguments, as DeepSpeed's
    # launch.py does unless --no_local_rank. Off by default: torchrun passes only LOCAL_RANK.
    local_rank_arg: bool = False
    run_id: str = field(default_factory=lambda: str(uuid.uuid4()))  # torchrun's rendezvous id
    log_dir: Path | None = None      # per-rank logs; None: ranks share our terminal
    env: dict[str, str] = field(default_factory=dict)
    grace_seconds: float = 3.0       # SIGTERM, then this long, then SIGKILL
    # Modules the forked ranks will need, imported once here (see _warm_parent). torch.optim
    # imports torch._dynamo when a rank builds its first optimizer: 1.8 s of CPU in every rank
    # unless the parent has it. A job that builds none (`minitron trace` without --steps)
    # passes warm=() and saves the parent that time.
    warm: tuple[str, ...] = ("torch._dynamo",)
    # --hang-timeout: seconds without any rank finishing a traced call before the job counts as
    # hung, is diagnosed and stopped (hang_watch.py). Needs tracing on (MINITRON_TRACE_DIR in env).
    hang_timeout: float | None = None

    @property
    def start_method(self) -> str:
        return "spawn" if self.backend == "nccl" else "fork"


def rank_env(rank: int, cfg: LaunchConfig) -> dict[str, str]:
    """The variables torchrun and DeepSpeed's launch.py set for this rank (one node, so the
    local rank is the rank, and this node is node 0 of 1)."""
    env = {
        "RANK": str(rank), "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(cfg.world_size), "LOCAL_WORLD_SIZE": str(cfg.world_size),
        "GROUP_RANK": "0", "MASTER_ADDR": cfg.master_addr, "MASTER_PORT": str(cfg.master_port),
        # torchrun's: GROUP_* count nodes (agents); every worker has the one role "default";
        # a job that is never restarted has restart count 0 of at most 0 (--max-restarts).
        "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(cfg.world_size),
        "ROLE_NAME": "default", "TORCHELASTIC_RUN_ID": cfg.run_id,
        "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        # DeepSpeed's launch.py names the same facts its own way: node rank, nodes, ranks here.
        "CROSS_RANK": "0", "CROSS_SIZE": "1", "LOCAL_SIZE": str(cfg.world_size),
        # The rendezvous store lives in the launcher (see _host_store): ranks connect as clients.
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    if cfg.backend == "gloo" and "TORCH_GLOO_LAZY_INIT" not in os.environ:
        # Connect a gloo group's ranks on its first collective, not inside new_group: that is
        # what NCCL does by default, so CPU traces show the cost where GPU runs pay it. It
        # also makes 16-rank initialization ~40% faster here (137 groups, most never used).
        env["TORCH_GLOO_LAZY_INIT"] = "1"
    if "OMP_NUM_THREADS" not in os.environ:
        # Like torchrun: several ranks on one machine each get a share of its cores.
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // cfg.world_size))
    env.update(cfg.env)
    return env


def log_path(cfg: LaunchConfig, rank: int) -> Path | None:
    return cfg.log_dir / f"rank{rank}.log" if cfg.log_dir else None


def _run_forked_child(rank: int, cfg: LaunchConfig, target: Target, mask: set) -> None:
    """Body of a forked rank. Never returns: the child must not run the parent's code on.
    ``mask``: the signal mask to put back (the launcher forks with stop signals held)."""
    code = 1
    try:
        # A session of its own (so also a process group: killpg reaches anything this rank
        # starts). Not just a process group: a background group of the terminal's session is
        # stopped when it reads the terminal, which torch.distributed.breakpoint() does.
        os.setsid()
        # A rank is a program of its own: it collects cycles as any Python program does (the
        # command line turned the collector off for itself). What it inherited stays frozen.
        gc.enable()
        die_with_parent()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent decides; it stops us with SIGTERM
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.environ.update(rank_env(rank, cfg))
        path = log_path(cfg, rank)
        if path:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
        # Python's sys.stdout may not be fd 1 (pytest, Jupyter and rich replace it); the rank's
        # prints and tracebacks must go to the real descriptors, i.e. its log or our terminal.
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        import torch  # already loaded by _warm_parent: a lookup, which keeps this module torch-free
        torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
        code = run_target(target)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        traceback.print_exc()
        code = 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def rank_target(rank: int, cfg: LaunchConfig, target: Target) -> Target:
    """``target`` with DeepSpeed's ``--local_rank=N`` first among its arguments, if asked for."""
    if not cfg.local_rank_arg:
        return target
    if target.function is not None:
        raise ValueError("--local_rank=N is a command-line argument: it cannot be passed to a Python function")
    return replace(target, argv=[f"--local_rank={rank}", *target.argv])


def _start(rank: int, cfg: LaunchConfig, target: Target, mask: set | None):
    target = rank_target(rank, cfg, target)
    if cfg.start_method == "fork":
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            _run_forked_child(rank, cfg, target, mask)
        return ForkedProcess(pid)
    path = log_path(cfg, rank)
    out = open(path, "w") if path else None
    env = {**os.environ, **rank_env(rank, cfg)}
    console = [int(env[CONSOLE_FD_ENV])] if CONSOLE_FD_ENV in env else []
    return subprocess.Popen(target.command(), env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                            start_new_session=True, pass_fds=console)


def _warm_parent(target: Target, warm: tuple[str, ...] = ()) -> None:
    """Import what every rank needs once, here, so forked ranks inherit it.

    Measured on 2 cores: 16 forked ranks that each import torch take 13.6 s; forked from a
    parent that already has it, 1.2 s. Importing runs no torch op, so no thread pool starts.
    The imports are here, not at the top: the CLI imports this module to validate its input,
    and must not pay for torch before it knows the input is good.
    """
    # Here, not at the top: see the last sentence above.
    import numpy.random  # noqa: F401  (numpy loads it lazily: 15 ms per rank otherwise)
    import torch.distributed  # noqa: F401
    if target.module and target.module.startswith("minitron."):
        importlib.import_module(target.module)
    for module in warm:
        importlib.import_module(module)


@contextmanager
def frozen_heap() -> Iterator[None]:
    """While processes are forked from this one: every object it holds, out of the collector's reach.

    A forked child shares this process's memory until it writes to a page, and Python's cyclic
    collector writes to every object it walks (its bookkeeping sits in each object's header).
    After ``import torch`` a full collection walks ~170,000 objects, ~0.07 s of CPU, and finds
    nothing to free: they live as long as the program. In a child it would also copy every page
    that holds one. Frozen (gc.freeze), the inherited objects are never walked in the children;
    this process unfreezes its own once the children exist (the recipe in gc.freeze's docs).
    """
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def launch(cfg: LaunchConfig, target: Target, monitor: Callable[[], None] | None = None,
           on_hang: Callable[[Path, list, float], None] | None = None) -> None:
    """Run ``target`` on every rank; return when all exit 0, else raise RankFailure.

    ``monitor``, if given, is called about five times a second while the ranks run (the
    pretrain command uses it to refresh its progress display). Ctrl-C (KeyboardInterrupt)
    stops every rank before it propagates. With ``cfg.hang_timeout``, a job that stops moving
    is asked where it is, ``on_hang(trace_dir, ranks that did not answer, timeout)`` shows it while the
    ranks still live, and then every rank is stopped and JobHung raised.
    """
    if cfg.hang_timeout and not cfg.env.get(TRACE_DIR_ENV):
        raise ValueError("a hang timeout reads the ranks' trace: turn tracing on (MINITRON_TRACE_DIR)")
    if cfg.log_dir:
        cfg.log_dir.mkdir(parents=True, exist_ok=True)
    if target.function is not None and cfg.start_method != "fork":
        raise ValueError("a Python function can only run on forked (gloo) ranks")
    if cfg.start_method == "fork":
        _warm_parent(target, cfg.warm)
    errors = Path(tempfile.mkdtemp(prefix="minitron-errors-"))
    # Forked after the warm-up, so it starts warm too; sets master_port; removes ``errors``
    # when it ends, even if we were killed with SIGKILL.
    store = StoreKeeper(cfg, scratch=errors)
    watch = None
    if cfg.hang_timeout:
        trace_dir = Path(cfg.env[TRACE_DIR_ENV])
        watch = HangWatch(cfg.world_size, cfg.hang_timeout, trace_dir, errors)
        cfg = replace(cfg, env={**cfg.env, **watch.env, **flight_recorder_env(cfg.backend, trace_dir)})
    # Our terminal, kept open in every rank under a number the rank can find: a rank whose
    # output goes to a log still has to tell the user "waiting for a debugger on PORT".
    console = os.dup(2)
    cfg = replace(cfg, env={**cfg.env, CONSOLE_FD_ENV: str(console), ERROR_DIR_ENV: str(errors)})
    procs: list = []
    deaths = None
    try:
        held = stop_signals_held() if cfg.start_method == "fork" else nullcontext()
        with frozen_heap(), held as mask:
            for rank in range(cfg.world_size):
                procs.append(_start(rank, cfg, target, mask))
        deaths = DeathOrder(procs)
        next_tick = time.monotonic()
        while True:
            running = False
            for rank, p in enumerate(procs):
                code = p.poll()
                if code is None:
                    running = True
                elif code != 0:
                    rank, code = first_failure(procs, errors, deaths)
                    stop_process_groups(procs, cfg.grace_seconds)
                    raise RankFailure(rank, code, log_path(cfg, rank))
            if not running:
                stop_process_groups(procs, cfg.grace_seconds)  # what the ranks started dies with them
                return
            if watch is not None and watch.stalled():
                silent = watch.ask_where(procs)
                if on_hang is not None:
                    on_hang(watch.trace_dir, silent, cfg.hang_timeout)
                # Frozen first, all of them, then killed: a rank killed while its peers run would make each
                # of them print a lost connection under the diagnosis. A hung job has nothing to save.
                stop_process_groups(procs, 0, signal.SIGSTOP)
                raise JobHung(cfg.hang_timeout, silent)
            if monitor is not None and time.monotonic() >= next_tick:
                monitor()
                next_tick = time.monotonic() + 0.2
            deaths.wait(0.01)  # wakes at once when a rank dies, and notes in which order they do
    except BaseException as exc:
        if isinstance(exc, KeyboardInterrupt) and cfg.env.get(TRACE_DIR_ENV):
            ask_where(procs, Path(cfg.env[TRACE_DIR_ENV]))   # for `view DIR --hang` afterwards
        stop_process_groups(procs, cfg.grace_seconds)
        raise
    finally:
        if deaths is not None:
            deaths.close()
        os.close(console)
        if watch is not None:
            watch.close()
        shutil.rmtree(errors, ignore_errors=True)
        store.close()
