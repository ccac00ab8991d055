"""The stand-in for ``minitron`` and ``python`` in a docs command that bash runs (see warm_runner.py).

warm_client.py copies this file, as ``minitron``, ``python`` and ``python3``, into a folder it
puts first on bash's PATH. Run as one of those names, it asks the build's warm runner (the
socket in $MINITRON_WARM_SOCKET) to fork the call from its interpreter, which has torch and
minitron imported already, and hands over its argv, working directory, environment and its
own descriptors 0-2: the forked child reads and writes exactly where this process would have.
The stand-in then waits and exits with the child's exit code, as the real program would have.

What it cannot hand over it runs for real (``exec``): ``python -c``, ``python`` alone or with
interpreter flags, or no warm runner to ask. It imports nothing but the standard library's
smallest pieces and starts with ``-S`` (no site): it costs a few milliseconds, not an
``import torch``.
"""

import json
import os
import signal
import socket
import sys

REAL = {"minitron": "minitron", "python": "python", "python3": "python"}


def warm_argv(name: str, args: list[str]) -> list[str] | None:
    """The argv the warm runner runs for this call (see warm_runner._become), or None."""
    if name == "minitron":
        return ["minitron", *args]
    if args[:1] == ["-m"] and len(args) > 1:
        return ["python", *args]
    if args and not args[0].startswith("-") and args[0].endswith(".py"):
        return ["python", *args]
    return None


def main() -> None:
    name = os.path.basename(sys.argv[0])
    args = sys.argv[1:]
    argv = warm_argv(name, args)
    door = os.environ.get("MINITRON_WARM_SOCKET")
    conn = None
    if argv is not None and door:
        try:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(door)
        except OSError:
            conn = None
    if conn is None:  # run the real one: the venv's own, beside the interpreter running this
        real = os.path.join(os.environ.get("MINITRON_WARM_BIN", ""), REAL.get(name, name))
        os.execv(real, [real, *args])
    request = json.dumps({"argv": argv, "cwd": os.getcwd(), "env": dict(os.environ)}).encode()
    socket.send_fds(conn, [b"%010d" % len(request) + request], [0, 1, 2])
    reply = conn.makefile("rb")
    pid = None

    def stop(signum, _frame):
        # bash was told to stop (the build's time limit): so is the command, and all it started
        if pid:
            try:
                os.killpg(pid, signal.SIGKILL)
            except OSError:
                pass
        os._exit(128 + signum)

    for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, stop)
    for line in reply:
        word, *rest = line.split()
        if word == b"pid":
            pid = int(rest[0])
        elif word == b"exit":
            cpu_log = os.environ.get("MINITRON_WARM_CPU_LOG")
            if cpu_log:  # the build counts the child's CPU with the command's
                with open(cpu_log, "a") as log:
                    log.write(rest[1].decode() + "\n")
            os._exit(int(rest[0]) & 0xFF)
    sys.stderr.write(f"{name}: the docs' warm runner ended without an exit code\n")
    os._exit(1)


if __name__ == "__main__":
    main()
