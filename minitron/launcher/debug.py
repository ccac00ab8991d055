"""Attach a debugger to rank N: debugpy listens on HOST:(BASE + N) and the rank waits for it.

Two halves, split by the process boundary:

* ``debug_env`` runs in the launcher, before any rank exists. It checks the request (which
  ranks, which ports, how long to wait) and turns it into environment variables, so that a bad
  ``--debug`` is one line and exit code 2, not an error from every rank.
* ``wait_for_debugger_if_asked`` runs in every rank, from ``rank_session()``, before pretrain.
  It reads the same variables, so the feature works however the rank was started: forked by
  minitron's launcher (gloo), spawned by it (nccl), or started by torchrun, where you set the
  variables yourself::

      MINITRON_DEBUG_RANKS=1 torchrun --nproc-per-node 2 -m minitron.pretrain_gpt ...

debugpy is imported only inside a rank that was asked to wait. The launcher forks its ranks,
and a debugger already loaded in the parent would be copied, threads and sockets half-alive,
into every child.
"""

from __future__ import annotations

import errno
import faulthandler
import os
import signal
import socket
import sys
import threading
import time

RANKS_ENV = "MINITRON_DEBUG_RANKS"                # "1", "0,2", "all"
PORT_BASE_ENV = "MINITRON_DEBUG_PORT_BASE"        # rank R listens on BASE + R (default 5678)
HOST_ENV = "MINITRON_DEBUG_HOST"                  # default 127.0.0.1: this machine only
WAIT_TIMEOUT_ENV = "MINITRON_DEBUG_WAIT_TIMEOUT"  # seconds to wait for a client (default 600)
# Set by minitron's launcher: a descriptor of its own terminal, kept open in every rank, so the
# "waiting" line reaches the person who must act on it even when the rank's output goes to a log.
CONSOLE_FD_ENV = "MINITRON_CONSOLE_FD"

DEFAULT_PORT_BASE = 5678
DEFAULT_HOST = "127.0.0.1"
DEFAULT_WAIT_TIMEOUT = 600.0

_asked_in_pid: int | None = None  # a pid, not a flag: a forked child must not inherit "done"


def parse_ranks(spec: str, world: int) -> list[int]:
    """'3' -> [3], '0,2' -> [0, 2], '0-3' -> [0, 1, 2, 3], 'all' -> every rank."""
    text = str(spec).strip().lower()
    if text == "all":
        return list(range(world))
    ranks: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first, last = int(lo), int(hi if sep else lo)
        except ValueError:
            raise ValueError(f"--debug {spec!r}: expected rank numbers such as 3, 0,2, 0-3 or 'all'") from None
        bad = [r for r in (first, last) if not 0 <= r < world]
        if bad:
            raise ValueError(f"--debug {spec!r}: rank {bad[0]} is not in this world of {world}; "
                             f"choose ranks 0..{world - 1}")
        if first > last:
            raise ValueError(f"--debug {spec!r}: write a range low to high, as in {last}-{first}")
        ranks.update(range(first, last + 1))
    return sorted(ranks)


def debug_env(spec: str, world: int, port_base: int, host: str, wait_timeout: float) -> dict:
    """Check a --debug request against the world and return the variables every rank gets."""
    ranks = parse_ranks(spec, world)
    if not 1 <= port_base <= 65535:
        raise ValueError(f"--debug-port-base {port_base} is not a TCP port; use 1024..65535")
    if port_base + ranks[-1] > 65535:
        raise ValueError(f"--debug-port-base {port_base}: rank {ranks[-1]} would listen on port "
                         f"{port_base + ranks[-1]}, beyond 65535; use a base of at most {65535 - ranks[-1]}")
    if not host.strip():
        raise ValueError("--debug-host is empty; use 127.0.0.1 (this machine only)")
    _check_host(host.strip())
    if not wait_timeout > 0:
        raise ValueError(f"--debug-wait-timeout {wait_timeout:g}: give a number of seconds above 0")
    return {RANKS_ENV: ",".join(map(str, ranks)), PORT_BASE_ENV: str(port_base),
            HOST_ENV: host.strip(), WAIT_TIMEOUT_ENV: f"{wait_timeout:g}"}


def _check_host(host: str) -> None:
    """A rank can listen only on an address of its own machine: bind port 0 there once, now,
    so that a mistyped host is refused before any rank starts, not by rank 0 after all started.
    Binding port 0 takes no port from anyone (the kernel lends a free one until close)."""
    try:
        family = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)[0][0]
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((host, 0))
    except (OSError, UnicodeError) as exc:   # gaierror (no such name) is an OSError too
        reason = exc.strerror if getattr(exc, "strerror", None) else str(exc)
        raise ValueError(f"--debug-host {host!r}: a rank cannot listen there ({reason}); give an address of "
                         "this machine, e.g. 127.0.0.1 (this machine only) or 0.0.0.0 (every interface)") from None


def settings_from_env(world: int) -> tuple[list[int], int, str, float]:
    """(ranks, port base, host, wait timeout) from the environment, checked like the CLI's."""
    env = os.environ
    try:
        port_base = int(env.get(PORT_BASE_ENV, DEFAULT_PORT_BASE))
        wait_timeout = float(env.get(WAIT_TIMEOUT_ENV, DEFAULT_WAIT_TIMEOUT))
    except ValueError:
        raise ValueError(f"{PORT_BASE_ENV} must be an integer and {WAIT_TIMEOUT_ENV} a number of seconds; "
                         f"got {env.get(PORT_BASE_ENV)!r} and {env.get(WAIT_TIMEOUT_ENV)!r}") from None
    checked = debug_env(env[RANKS_ENV], world, port_base, env.get(HOST_ENV, DEFAULT_HOST), wait_timeout)
    return [int(r) for r in checked[RANKS_ENV].split(",")], port_base, checked[HOST_ENV], wait_timeout


def say(line: str) -> None:
    """Write one line to the launcher's terminal, and to this rank's own stderr if that is
    somewhere else (a log file), so the log keeps the record too."""
    data = (line + "\n").encode()
    sys.stderr.flush()
    fds = [2]
    try:
        console = int(os.environ.get(CONSOLE_FD_ENV, ""))
        seen = os.fstat(console)
        here = os.fstat(2)
        if (seen.st_dev, seen.st_ino) != (here.st_dev, here.st_ino):
            fds.insert(0, console)
    except (ValueError, OSError):
        pass  # no launcher terminal (torchrun, plain python): stderr is the terminal
    for fd in fds:
        try:
            os.write(fd, data)  # one write of one short line: ranks never interleave mid-line
        except OSError:
            pass


def fail(line: str, code: int = 1):
    """End this rank with one clear line; the launcher then stops the others and names us."""
    # stderr only: under minitron's launcher that is the rank's log, whose tail the launcher
    # prints when it reports the failed rank; under torchrun it is the terminal.
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
    raise SystemExit(code)


def _check_port(rank: int, host: str, port: int) -> None:
    """Bind the port once ourselves first: 'in use' then names the rank and the port, instead of
    surfacing later as an error string from inside debugpy's adapter process."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as debugpy binds it
        try:
            probe.bind((host, port))
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                fail(f"rank {rank}: port {port} on {host} is already in use, so the debugger cannot "
                     f"listen there; free it or pick another --debug-port-base ({PORT_BASE_ENV})")
            fail(f"rank {rank}: cannot listen for a debugger on {host}:{port}: {exc.strerror}; "
                 f"check --debug-host ({HOST_ENV})")


def wait_for_debugger_if_asked(rank: int) -> None:
    """If this rank is in MINITRON_DEBUG_RANKS: listen, say where, and wait for a client.

    Returns once a client has attached and finished configuring (its breakpoints are set), so
    the rank then runs into them. Ends the rank with one line if the port is taken or nobody
    attaches within the wait timeout.
    """
    global _asked_in_pid
    if not os.environ.get(RANKS_ENV) or _asked_in_pid == os.getpid():
        return  # not asked, or asked already (rank sessions nest: launcher's, then the program's)
    _asked_in_pid = os.getpid()
    try:
        ranks, port_base, host, wait_timeout = settings_from_env(int(os.environ.get("WORLD_SIZE", rank + 1)))
    except ValueError as exc:
        fail(f"rank {rank}: {exc}", code=2)
    # Every rank of a debug job, paused or not, prints its Python stack (all threads) to its
    # log on `kill -USR1 PID`: the way to see where the *others* wait while one rank is held.
    # faulthandler writes from the signal handler itself, so it works while the rank is
    # blocked inside torch's C++ (a store wait, a collective), where a debugger cannot pause.
    faulthandler.register(signal.SIGUSR1, all_threads=True)
    if rank not in ranks:
        return
    port = port_base + rank
    pydevd = sys.modules.get("pydevd")
    if pydevd is not None and pydevd.get_global_debugger() is not None:
        # The launcher itself runs under a debugger, and debugpy follows forked and spawned
        # children into the same session: this rank is being debugged already, and a second
        # listen() in one process would only confuse both.
        say(f"rank {rank}: already under the launcher's debugger; not listening on {host}:{port}")
        return
    _check_port(rank, host, port)

    # Python 3.11 freezes some stdlib modules; pydevd warns about that on every start. The
    # modules concerned are not where anyone steps, and the warning would bury our one line.
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    import debugpy   # only a rank asked to wait for a debugger loads debugpy

    # listen() starts the adapter: a separate `python .../debugpy/adapter` process that owns
    # HOST:PORT, speaks DAP to the editor and relays to the debugger inside this process. It
    # detaches from us (its own session, so stopping our process group misses it) and exits
    # when our connection to it closes. Killed halfway through the handshake, we would leave
    # it waiting forever for a connection that never comes, holding the port; so a stop
    # request (SIGTERM from the launcher) is held until the handshake is done.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
    try:
        debugpy.listen((host, port))
    except (RuntimeError, OSError, ValueError) as exc:
        fail(f"rank {rank}: cannot listen for a debugger on {host}:{port}: {exc}")
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    say(f"rank {rank}: waiting for a debugger on {host}:{port}")

    timer = threading.Timer(wait_timeout, _cancel_wait, args=(debugpy,))
    timer.daemon = True
    timer.start()
    debugpy.wait_for_client()  # returns on configurationDone, or when the timer cancels it
    timer.cancel()
    if not debugpy.is_client_connected():
        _stop_adapter(port)
        fail(f"rank {rank}: no debugger attached within {wait_timeout:g} s on {host}:{port}; "
             f"attach sooner, raise --debug-wait-timeout ({WAIT_TIMEOUT_ENV}) or drop --debug")


def _adapter_pids(port: int) -> list[int]:
    """Processes of debugpy's adapter serving ``port`` (Linux's /proc; none found elsewhere)."""
    found = []
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/cmdline", "rb") as f:
                    argv = f.read().decode(errors="replace").split("\0")
            except OSError:
                continue   # gone meanwhile, or not ours to read
            serves = "--port" in argv and argv[argv.index("--port") + 1:][:1] == [str(port)]
            if serves and "--for-server" in argv and any("debugpy" in a for a in argv):
                found.append(int(entry))
    return found


def _stop_adapter(port: int, within: float = 10.0) -> None:
    """Stop the adapter listen() started for this rank, and wait (a while) until it is gone.

    It detached from us and would go by itself once it noticed our connection close: a moment
    on a quiet machine, over a minute on a loaded one (seen in tests/test_debug_attach.py), all
    the while holding the port the user will want again for the next try. A rank that gives up
    waiting therefore stops it itself, so the job ends with nothing of it left behind.

    With SIGKILL, not SIGTERM: the adapter was started while this rank held SIGTERM blocked
    (listen() above), and a process inherits the signal mask of the thread that started it,
    through fork and exec alike. So the adapter holds SIGTERM too, pending until it exits by
    itself: a SIGTERM here used to cost every give-up the whole ``within`` wait (10 s), and
    the adapter lingered 40 s more. The adapter keeps no state worth a clean exit."""
    for pid in _adapter_pids(port):
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass   # gone already
    deadline = time.monotonic() + within
    while _adapter_pids(port) and time.monotonic() < deadline:
        time.sleep(0.05)


def _cancel_wait(debugpy) -> None:
    # wait_for_client.cancel() only exists once the wait has begun; the timer could in theory
    # fire first (a tiny timeout on a busy machine), so try until the wait is there to cancel.
    while True:
        try:
            debugpy.wait_for_client.cancel()
            return
        except RuntimeError:
            time.sleep(0.05)
