"""The harness of tests/refusals.py's ``run_cases(..., fork=False)``: the cases one after another in
this one torch-free process (why, and what is checked: refusals.py's docstring). Cases arrive as
JSON lines on stdin; one JSON result line per case goes to stdout.

    python refusals_sequential.py MEMORY_CAP < cases.jsonl
"""

import ctypes
import json
import os
import resource
import signal
import sys
import time
import traceback

import minitron.cli
from minitron.cli import main
from typer_command_cache import build_once

build_once(minitron.cli.app)   # typer's command from the app, built once for every case

# A child subreaper: whatever a case started, even a daemon that double-forked out of its
# session, ends up this process's child, so "a process left running" is "a live child".
ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0)   # PR_SET_CHILD_SUBREAPER
cases = [json.loads(line) for line in sys.stdin.read().splitlines() if line.strip()]
null = os.open(os.devnull, os.O_RDONLY)   # a case reads no input, as in the forked harness
os.dup2(null, 0)
os.close(null)
sys.stdin = open(os.devnull)
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), int(sys.argv[1])))
channel = os.fdopen(os.dup(1), "w", buffering=1)   # the results; fd 1 becomes each case's stdout
keep = {1: os.dup(1), 2: os.dup(2)}
real = sys.stdout, sys.stderr
# What a command may set on its way to a refusal (the launcher's Ctrl-C handling): put back
# after each case, so the next one starts as a fresh process would.
HANDLED = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE, signal.SIGUSR1]


class Timeout(BaseException):   # not an Exception: main()'s own handlers must not take it
    pass


def alarm(signum, frame):
    raise Timeout


def children() -> list:
    found = []
    for task in os.listdir("/proc/self/task"):
        with open(f"/proc/self/task/{task}/children") as f:
            found += [int(pid) for pid in f.read().split()]
    return found


def reap() -> None:
    """Collect the children that ended (a case that waited for its processes leaves none)."""
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


for case in cases:
    saved_cwd, saved_env, saved_argv = os.getcwd(), dict(os.environ), sys.argv
    handlers = {sig: signal.getsignal(sig) for sig in HANDLED}
    started = time.perf_counter()
    for fd, path in ((1, case["out"]), (2, case["err"])):   # the fds too: a subprocess's output
        target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(target, fd)
        os.close(target)
    sys.stdout = os.fdopen(1, "w", buffering=1, closefd=False)
    sys.stderr = os.fdopen(2, "w", buffering=1, closefd=False)
    code, timed_out = 0, False
    signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, case["timeout"])
    try:
        os.chdir(case["cwd"])
        os.environ.clear()
        os.environ.update(case["env"])
        sys.argv = ["minitron", *case["argv"]]
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
            if not isinstance(exc.code, (int, type(None))):
                print(exc.code, file=sys.stderr)
        except Timeout:
            timed_out, code = True, -9
        except BaseException:
            traceback.print_exc()   # what the interpreter would print for an uncaught exception
            code = 1
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    sys.stdout.flush()
    sys.stderr.flush()
    sys.stdout, sys.stderr = real
    for fd in (1, 2):
        os.dup2(keep[fd], fd)
    for sig, handler in handlers.items():
        signal.signal(sig, handler if handler is not None else signal.SIG_DFL)
    os.chdir(saved_cwd)
    os.environ.clear()
    os.environ.update(saved_env)
    sys.argv = saved_argv
    reap()
    left = bool(children())
    while children():   # kill what is left, and what each death hands to this subreaper
        for pid in children():
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        time.sleep(0.01)
        reap()
    torch = "torch" in sys.modules
    with open(case["err"] + ".torch", "w") as marker:
        marker.write("1" if torch else "0")
    channel.write(json.dumps({"code": code, "seconds": time.perf_counter() - started,
                              "timed_out": timed_out, "left": left}) + "\n")
    if torch:
        sys.exit(0)   # no later case could show it refused before torch: a fresh harness takes them
