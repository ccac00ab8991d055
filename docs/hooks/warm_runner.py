"""Run the docs' commands from a warm interpreter: import torch once per build, not per command.

A `minitron ...` or `python script.py` command pays about 2 s of CPU just to import torch,
and the site runs dozens of them. So the build starts this module once as a helper process
(``python docs/hooks/warm_runner.py``): it imports torch and minitron, then reads one request
per line on stdin and, for each, forks a child that runs the command as a fresh process would
(``sys.argv``, working directory, environment, ``__main__``) with its output sent to a file.
The helper never runs a thread, so forking it is safe — the same idea as the launcher's warm
parent (appendix A, "How minitron runs ranks").

Protocol: a request is one JSON line ``{"argv": [...], "cwd": ..., "env": {...}, "out": PATH}``;
the child writes its output to PATH and, when it ends, its exit code to PATH + ".rc".
A plain program call, or a chain of them (``A > /dev/null && B``), runs warm, also when its
output goes through a small filter (``| sort``) or it ends in ``|| echo "(exit code $?)"``
(see warm_plan); anything else (other redirections, variables, ``;``) stays with bash.

A command that stays with bash still runs its ``minitron`` and ``python`` calls warm: bash finds
them first on PATH as small stand-ins (warm_shim.py) that hand their argv, working directory,
environment and their own stdin/stdout/stderr to this helper over a Unix socket (``--socket
PATH``) and exit with the child's exit code. The child then writes straight into bash's pipes
and files, so the output is what the real program would write there; bash does the rest
(``$(...)``, ``;``, ``cat``, ``ls``, ``$PIPESTATUS``) as it always does.
"""

from __future__ import annotations

import json
import os
import resource
import runpy
import select
import shlex
import shutil
import signal
import socket
import sys
import traceback

# Outside quotes, these need a real shell (variables, globs, subshells, escapes...).
SHELL_SYNTAX = set("$`*?[]{}~!\\\n()<;")
PROGRAMS = ("minitron", "python", "python3")


OR_EXIT_CODE = ["||", "echo", "(exit code $?)"]
MERGE = ["2", ">&", "1"]


def warm_steps(command: str, bin_dir: str) -> list[tuple[list[str], bool]] | None:
    """The program calls to run warm, in order, each with whether its output is thrown away;
    or None if the command needs bash (see warm_plan, which also understands a last pipe)."""
    plan = warm_plan(command, bin_dir)
    return plan[0] if plan is not None and plan[1] is None and not plan[2] else None


def warm_plan(command: str, bin_dir: str):
    """(steps, filter, or_exit_code), or None if the command needs bash.

    steps: the program calls to run warm, in order, each with whether its output is thrown
    away: one plain call, or a chain of them (``A > /dev/null && B``: how a page runs a job and
    then shows what it left); ``2>&1`` after a call changes nothing, its output being stdout and
    stderr together anyway. filter: (argv, merged): a small program the last call's output is
    piped into (``| sort``, ``| grep -v X``, ``| head -3``), its stdout only unless the call
    ends in ``2>&1`` (merged); or None. or_exit_code: the command ends
    in ``|| echo "(exit code $?)"``. Other pipes, ``2>/dev/null``, ``;`` and the rest stay with bash."""
    bare = outside_quotes(command)
    if bare is None or any(ch in SHELL_SYNTAX for ch in bare):
        return None
    lexer = shlex.shlex(command, posix=True, punctuation_chars="&|>")
    lexer.whitespace_split = True
    tokens = list(lexer)
    or_exit_code = tokens[-3:] == OR_EXIT_CODE
    tokens = tokens[:-3] if or_exit_code else tokens
    pipe = None
    if "|" in tokens:
        at = tokens.index("|")
        tokens, pipe = tokens[:at], tokens[at + 1:]
        if or_exit_code or not pipe or pipe[0] not in FILTERS or any(set(w) <= set("&|>") for w in pipe):
            return None
    steps, argv, merged = [], [], False
    for token in [*tokens, "&&"]:
        if token != "&&":
            argv.append(token)
            continue
        merged = argv[-3:] == MERGE
        if merged:
            argv = argv[:-3]
        silenced = argv[-2:] == [">", "/dev/null"]
        argv = argv[:-2] if silenced else argv
        if not argv or argv[0] not in (*PROGRAMS, os.path.join(bin_dir, "python")) \
                or any(set(word) <= set("&|>") for word in argv):
            return None
        steps.append((argv, silenced))
        argv = []
    if pipe is not None and steps[-1][1]:
        return None  # `A > /dev/null | F`: nothing to filter; leave the oddity to bash
    return steps, pipe and (pipe, merged), or_exit_code


# Programs a warm command's output may be piped into: each reads its input and prints a part.
FILTERS = ("sort", "grep", "head", "tail", "sed", "fold")


def outside_quotes(command: str) -> str | None:
    """The command without its quoted parts (None if it escapes a quote: leave that to bash)."""
    kept, quote = [], None
    for ch in command:
        if ch == "\\" and quote != "'":
            return None
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        else:
            kept.append(ch)
    return None if quote else "".join(kept)


def _run_child(request: dict) -> None:
    """In the forked child: become the command, then exit with its code."""
    code = 1
    try:
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the command waits for its own children
        os.setsid()  # its own session, like a command bash would start: the launcher kills groups
        fd = os.open(request["out"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.close(fd)
        if request.get("err"):  # stderr on its own (the command's stdout goes into a pipe)
            fd = os.open(request["err"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 2)
            os.close(fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        code = _become(request)
    except BaseException:
        traceback.print_exc()
    finally:
        with open(request["out"] + ".rc.tmp", "w") as f:
            f.write(f"{code} {_cpu_seconds():.2f}")
        os.replace(request["out"] + ".rc.tmp", request["out"] + ".rc")
        os._exit(code)


def _cpu_seconds() -> float:
    """CPU of this child and of every process it waited for (its ranks)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def _become(request: dict) -> int:
    """Run the request's program in this process, on file descriptors 0-2 as they are set up
    now, as a fresh process would (argv, working directory, environment, ``__main__``); its
    exit code. A traceback is printed as the interpreter would print it."""
    code = 1
    try:
        sys.stdin = open(0, "r", closefd=False)
        sys.stdout = open(1, "w", buffering=1, closefd=False)
        sys.stderr = open(2, "w", buffering=1, closefd=False)
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        argv = request["argv"]
        if argv[0] == "minitron":
            from minitron.cli import main
            sys.argv = ["minitron", *argv[1:]]
            main()
        elif len(argv) > 2 and argv[1] == "-m":
            sys.argv = [argv[2], *argv[3:]]
            runpy.run_module(argv[2], run_name="__main__", alter_sys=True)
        else:
            sys.argv = argv[1:]
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[1])))
            runpy.run_path(argv[1], run_name="__main__")
        code = 0
    except SystemExit as exc:
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:  # sys.exit("message"): the interpreter prints it and exits 1
            print(exc.code, file=sys.stderr)
            code = 1
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            sys.stdout.flush()
            sys.stderr.flush()
        except (OSError, ValueError):  # the reader went away (`| head -3`), or the program closed them
            pass
    return code


def _serve_shim(conn: socket.socket) -> None:
    """In the forked child: a warm_shim.py request (its descriptors 0-2 come with it): become
    the command on them, tell the stand-in our pid, then the exit code and CPU; exit."""
    code = 1
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        size, data = int(data[:10]), data[10:]
        while len(data) < size:
            more = conn.recv(1 << 16)
            if not more:
                os._exit(1)
            data += more
        request = json.loads(data)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)  # the command waits for its own children
        os.setsid()  # as in _run_child; the stand-in stops this group if bash is stopped
        conn.sendall(f"pid {os.getpid()}\n".encode())
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
            os.close(fd)
        code = _become(request)
    except BaseException:
        traceback.print_exc()
    finally:
        try:
            conn.sendall(f"exit {code} {_cpu_seconds():.2f}\n".encode())
        finally:
            os._exit(code)


def serve() -> None:
    import minitron.cli  # noqa: F401
    from minitron.launcher.launch import LaunchConfig, _warm_parent
    from minitron.launcher.worker import Target

    # What the launcher imports before it forks a training job's ranks (torch, the training
    # stack, torch._dynamo for a rank's first optimizer), imported here once for every command:
    # the launcher in each child then finds it loaded. Without torch._dynamo, every training
    # command on the site paid ~1 s of CPU for it again.
    _warm_parent(Target(module="minitron.pretrain_gpt"), LaunchConfig.warm)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children reap themselves; results go by file
    listener = None
    if "--socket" in sys.argv:  # the stand-ins' door (see the module docstring)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(sys.argv[sys.argv.index("--socket") + 1])
        listener.listen(16)
    print("ready", flush=True)
    try:
        _serve(listener)
    finally:
        if listener:  # its folder too (the stand-ins beside it): the build may have died unannounced
            listener.close()
            shutil.rmtree(os.path.dirname(sys.argv[sys.argv.index("--socket") + 1]), ignore_errors=True)


def _serve(listener) -> None:
    """Fork a child for each request, from the build (stdin) or a stand-in (the listener),
    until the build closes our stdin."""
    pending = b""
    stdin = sys.stdin.fileno()
    while True:
        readable, _, _ = select.select([stdin] + ([listener] if listener else []), [], [])
        if listener in readable:
            conn, _ = listener.accept()
            if os.fork() == 0:
                listener.close()
                _serve_shim(conn)
            conn.close()  # the child has it; the command's descriptors never pass through here
        if stdin in readable:
            chunk = os.read(stdin, 1 << 16)
            if not chunk:
                return  # the build closed our stdin: it is done
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                request = json.loads(line)
                if os.fork() == 0:
                    if listener:
                        listener.close()
                    _run_child(request)


if __name__ == "__main__":
    serve()
