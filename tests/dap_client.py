"""A small Debug Adapter Protocol client: what VS Code does when you press "attach", in code.

DAP runs over one TCP connection. Each message is a JSON object preceded by an HTTP-like
header, ``Content-Length: N\\r\\n\\r\\n``. Three kinds travel:

* requests (``{"type": "request", "seq": 7, "command": "stackTrace", "arguments": {...}}``),
* responses, matched to their request by ``request_seq``,
* events the debuggee sends on its own (``initialized``, ``stopped``, ``output``, ...).

A reader thread files every incoming message; the test then waits for the response or event it
needs. Responses are not always immediate: debugpy answers ``attach`` only after
``configurationDone``, which is why ``send`` and ``response`` are separate steps.

Run as a script (``python tests/dap_client.py``), it drives a worked debugging session on a
4-rank job and prints it; walkthrough/02-debugging.md shows that output.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time

from minitron.launcher.processes import ForkedProcess


class DapError(RuntimeError):
    pass


class DapClient:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.seq = 0
        self.messages: list[dict] = []       # every message received, in order
        self.taken: set[int] = set()         # indices of events already handed out
        self.cond = threading.Condition()
        self.closed = False
        self.reader = threading.Thread(target=self._read_loop, daemon=True)
        self.reader.start()

    @classmethod
    def connect(cls, host: str, port: int, timeout: float = 30.0) -> "DapClient":
        """Connect, retrying while the adapter is not listening yet."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                return cls(socket.create_connection((host, port), timeout=5))
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    # -- wire format -------------------------------------------------------------------------
    def _read_loop(self) -> None:
        self.sock.settimeout(None)
        stream = self.sock.makefile("rb")
        try:
            while True:
                length = None
                while True:  # header lines up to the blank line
                    line = stream.readline()
                    if not line:
                        return
                    line = line.strip()
                    if not line:
                        break
                    name, _, value = line.decode("ascii").partition(":")
                    if name.lower() == "content-length":
                        length = int(value)
                if length is None:
                    raise DapError("a DAP message without Content-Length")
                message = json.loads(stream.read(length).decode("utf-8"))
                with self.cond:
                    self.messages.append(message)
                    self.cond.notify_all()
        except OSError:
            pass
        finally:
            with self.cond:
                self.closed = True
                self.cond.notify_all()

    def send(self, command: str, **arguments) -> int:
        """Send a request; return its seq, to wait for the response later."""
        self.seq += 1
        body = json.dumps({"seq": self.seq, "type": "request", "command": command,
                           "arguments": arguments}).encode("utf-8")
        self.sock.sendall(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        return self.seq

    # -- waiting ------------------------------------------------------------------------------
    def _wait(self, pick, what: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                found = pick()
                if found is not None:
                    return found
                left = deadline - time.monotonic()
                if self.closed or left <= 0:
                    why = "the connection closed" if self.closed else f"nothing in {timeout:g} s"
                    raise DapError(f"waiting for {what}: {why}")
                self.cond.wait(left)

    def response(self, seq: int, timeout: float = 30.0) -> dict:
        """The response to request ``seq``; a failed request raises with the adapter's message."""
        def pick():
            return next((m for m in self.messages
                         if m.get("type") == "response" and m.get("request_seq") == seq), None)
        reply = self._wait(pick, f"the response to request {seq}", timeout)
        if not reply.get("success"):
            raise DapError(f"{reply.get('command')} failed: {reply.get('message')} {reply.get('body', '')}")
        return reply

    def request(self, command: str, timeout: float = 30.0, **arguments) -> dict:
        return self.response(self.send(command, **arguments), timeout)

    def event(self, name: str, timeout: float = 30.0) -> dict:
        """The next not-yet-taken event called ``name``."""
        def pick():
            for i, m in enumerate(self.messages):
                if i not in self.taken and m.get("type") == "event" and m.get("event") == name:
                    self.taken.add(i)
                    return m
            return None
        return self._wait(pick, f"the {name!r} event", timeout)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


# -- a worked session, for the walkthrough ----------------------------------------------------
# `python tests/dap_client.py` runs a 4-rank job with rank 3 waiting for a debugger, drives it
# through this client, and prints what happened. walkthrough/02-debugging.md shows its output.

def _short(path: str) -> str:
    """A path as a reader would look it up: from the package root, not from this machine's /."""
    from minitron.launcher.vscode import CHECKOUT
    for marker in ("site-packages/", str(CHECKOUT) + "/"):
        if marker in path:
            return path.split(marker, 1)[1]
    return path


def _stack(client: DapClient, thread: int, depth: int) -> list[str]:
    frames = client.request("stackTrace", threadId=thread, levels=depth)["body"]["stackFrames"]
    return [f"{f['name']} ({_short(f['source'].get('path', '?'))}:{f['line']})" for f in frames]


def _fd_target(proc, fd: int) -> str | None:
    try:
        return os.readlink(proc / "fd" / str(fd))
    except OSError:
        return None


def _first_body_line(func) -> tuple[str, int]:
    """File and first executed line of ``func``'s body (under any decorators)."""
    import inspect
    code = inspect.unwrap(func).__code__
    return code.co_filename, min(line for _, _, line in code.co_lines() if line and line > code.co_firstlineno)


class _ForkedCommand(ForkedProcess):
    """``minitron ARGV`` as a forked copy of this process, which has imported torch already:
    the command line's own entry point, without a second interpreter paying for that import
    (~1.5 s of CPU). The part of Popen's interface the demo uses (the launcher's ForkedProcess,
    with a wait that gives up and a signal)."""

    def __init__(self, argv: list[str], terminal, env: dict[str, str]):
        import signal
        import sys

        sys.stdout.flush()
        sys.stderr.flush()
        terminal.touch()  # before the fork: the demo reads it at once
        pid = os.fork()
        if pid:
            super().__init__(pid)
            return
        code = 1
        try:
            # As a fresh `minitron` would start: Ctrl-C raises KeyboardInterrupt (the launcher
            # then stops every rank), even where this process was started with SIGINT ignored
            # (a suite run in the background).
            signal.signal(signal.SIGINT, signal.default_int_handler)
            os.environ.update(env)
            fd = os.open(terminal, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(fd, 1)
            os.dup2(fd, 2)
            os.close(fd)
            sys.stdout = open(1, "w", buffering=1, closefd=False)
            sys.stderr = open(2, "w", buffering=1, closefd=False)
            sys.argv = list(argv)
            from minitron.cli import main
            main()
            code = 0
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:
            import traceback
            traceback.print_exc()   # into the terminal file, which the demo prints on failure
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)

    def wait(self, timeout: float) -> int:
        deadline = time.monotonic() + timeout
        while self.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"minitron (pid {self.pid}) still running after {timeout} s")
            time.sleep(0.05)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        os.kill(self.pid, sig)


def demo() -> int:
    import shutil
    import signal
    import tempfile
    from pathlib import Path

    import torch.distributed.distributed_c10d as c10d

    from minitron.launcher import free_port

    port = free_port()  # rank 3's port; the job's base is 3 lower
    out = Path(tempfile.mkdtemp(prefix="minitron-debug-demo-"))
    argv = ["minitron", "trace", "--world", "4", "--debug", "3", "--debug-port-base", str(port - 3),
            "--debug-wait-timeout", "60", "--out", str(out)]
    print("$", " ".join(argv[:6]), "...")
    terminal = out / "terminal.txt"
    client = None
    # Eager gloo connections: new_group itself then waits for every member, which is what this
    # session shows (the launcher's default is lazy).
    job = _ForkedCommand(argv, terminal, {"COLUMNS": "200", "TORCH_GLOO_LAZY_INIT": "0"})
    try:
        while "waiting for a debugger" not in terminal.read_text():
            assert job.poll() is None, terminal.read_text()
            time.sleep(0.02)
        print(terminal.read_text().strip().replace(str(port), "PORT"))

        client = DapClient.connect("127.0.0.1", port)
        client.request("initialize", clientID="demo", adapterID="debugpy", pathFormat="path",
                       linesStartAt1=True, columnsStartAt1=True)
        attach = client.send("attach", justMyCode=False)
        client.event("initialized")
        client.request("setFunctionBreakpoints", breakpoints=[{"name": "create_group"}])
        client.request("configurationDone")
        client.response(attach)
        print("client  -> initialize, attach, setFunctionBreakpoints [create_group], configurationDone")

        stop = client.event("stopped", timeout=60)["body"]
        thread = stop["threadId"]
        print(f"rank 3  <- stopped ({stop['reason']}) in {_stack(client, thread, 1)[0]}")
        frame = client.request("stackTrace", threadId=thread, levels=1)["body"]["stackFrames"][0]
        for expr in ("ranks", "group_desc"):
            value = client.request("evaluate", expression=expr, frameId=frame["id"], context="watch")
            print(f"           {expr} = {value['body']['result']}")
        print("client     (holds rank 3 here for 2 s, as a person reading those values would)")
        time.sleep(2)

        # Function breakpoints must go before we detach (see the chapter), and a line inside
        # torch's new_group takes us into the call this rank is about to make.
        path, line = _first_body_line(c10d.new_group)
        client.request("setFunctionBreakpoints", breakpoints=[])
        client.request("setBreakpoints", source={"path": path}, breakpoints=[{"line": line}])
        client.request("continue", threadId=thread)
        print(f"client  -> setFunctionBreakpoints [], setBreakpoints {_short(path)}:{line}, continue")
        stop = client.event("stopped", timeout=60)["body"]
        print(f"rank 3  <- stopped ({stop['reason']}); its call stack, innermost first:")
        for entry in _stack(client, stop["threadId"], 7):
            print(f"           {entry}")

        # Rank 0 is not under a debugger, and is blocked inside C++ anyway, where no debugger
        # could pause it; faulthandler (armed in every rank of a debug job) prints its stack.
        log = out / "logs" / "rank0.log"
        rank0 = next(int(p.name) for p in Path("/proc").iterdir()  # the process writing that log
                     if p.name.isdigit() and _fd_target(p, 2) == str(log))
        os.kill(rank0, signal.SIGUSR1)
        print("rank 0, meanwhile (kill -USR1 <its pid>; from its log), innermost first:")
        deadline = time.monotonic() + 30
        while "in create_group" not in log.read_text():
            assert time.monotonic() < deadline, "rank 0 printed no stack"
            time.sleep(0.02)
        # faulthandler prints every thread, each block headed "Thread 0x... (most recent call
        # first):"; the main thread is the one in create_group (a traced rank also keeps a
        # sleeping helper thread, trace/dump.py's doorbell, whose block may come first).
        blocks, block = [], []
        for ln in log.read_text().splitlines():
            if "(most recent call first)" in ln:
                blocks.append(block := [])
            elif ln.strip().startswith("File "):
                block.append(ln.strip())
        frames = next(b for b in blocks if any(f.endswith("in create_group") for f in b))
        for entry in frames[:next(i for i, f in enumerate(frames) if f.endswith("in create_group")) + 1]:
            name = entry.rsplit(" in ", 1)[1]
            where = entry.split('"')[1]
            print(f"           {name} ({_short(where)}:{entry.split('line ')[1].split()[0]})")

        client.request("setBreakpoints", source={"path": path}, breakpoints=[])
        client.request("continue", threadId=stop["threadId"])
        client.request("disconnect")
        client.close()
        client = None
        print("client  -> setBreakpoints [], continue, disconnect")
        code = job.wait(60)
        print(f"job exit code {code}")
        if code != 0:
            print(terminal.read_text())
            return 1

        print("time each rank spent in new_group(DATA_PARALLEL_GROUP_WITH_CP), from the trace:")
        for rank in range(4):
            for line in (out / f"rank{rank}.jsonl").read_text().splitlines():
                record = json.loads(line)
                if record["name"] == "torch.distributed.new_group" and \
                        record["args"]["group_desc"] == "DATA_PARALLEL_GROUP_WITH_CP":
                    print(f"           rank {rank}: {(record['end_us'] - record['start_us']) / 1e6:.1f} s")
        return 0
    finally:
        if job.poll() is None:
            job.send_signal(signal.SIGINT)  # the launcher stops every rank on Ctrl-C
            job.wait(30)
        if client is not None:
            # A goodbye, not just a closed socket: an adapter whose rank is gone waits for it.
            try:
                client.request("disconnect", timeout=5)
            except (DapError, OSError):
                pass
            client.close()
        shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    import sys
    sys.exit(demo())
