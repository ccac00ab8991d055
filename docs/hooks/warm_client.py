"""The build's side of the warm runner (warm_runner.py): start it, hand it commands, stop it.

Why a client of its own: the warm runner is a helper process with a socket, stand-in programs
(warm_shim.py) and a request file per command; command_run.py only asks it to run an argv, or
for the PATH on which bash finds the stand-ins, and does not need to know how.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

from mkdocs.exceptions import PluginError

from . import warm_runner


class WarmRunner:
    """The helper process of warm_runner.py, started on first use and stopped with the build.

    ``env`` gives the commands' environment (command_run.command_env), asked anew for each
    start and request: it holds the build's SOURCE_DATE_EPOCH, known only once the build runs."""

    def __init__(self, env: Callable[[], dict[str, str]], timeout_s: float):
        self._proc = None
        self._lock = threading.Lock()
        self._env, self.timeout_s = env, timeout_s
        self.module = warm_runner
        self.path = Path(self.module.__file__)
        self.door = None  # the folder of its socket and of the stand-ins (warm_shim.py), once started
        # A build with commands to run sets this (on_files): its bash commands start the helper
        # for their stand-ins. Otherwise (one page expanded on its own, as tests do) they use
        # it only if it is running already: starting it costs an `import torch`, which one
        # command that bash runs pays at most once.
        self.expected = False
        self.cpu = 0.0   # CPU seconds of the last run(), its stand-ins' calls included
    def _start(self, root: Path) -> None:
        """Start the helper, with its socket and the stand-ins bash finds first on PATH (called
        with the lock held)."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self._remove_door()
        # A short path of its own: a Unix socket's path must fit in 107 bytes.
        self.door = Path(tempfile.mkdtemp(prefix="minitron-warm-"))
        (self.door / "bin").mkdir()
        shim = self.path.with_name("warm_shim.py").read_text()
        for name in ("minitron", "python", "python3"):
            stand_in = self.door / "bin" / name
            stand_in.write_text(f"#!{sys.executable} -S\n{shim}")
            stand_in.chmod(0o755)
        self._proc = subprocess.Popen([sys.executable, str(self.path), "--socket", str(self.door / "socket")],
                                      cwd=root, env=self._env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True)
        if self._proc.stdout.readline().strip() != "ready":
            raise PluginError("the docs' warm runner did not start")

    def shim_env(self, root: Path) -> dict[str, str]:
        """What bash needs for its `minitron` and `python` calls to run warm (warm_shim.py)."""
        with self._lock:
            if not self.expected and (self._proc is None or self._proc.poll() is not None):
                return {}
            self._start(root)
            return self._door_env()

    def _door_env(self) -> dict[str, str]:
        """The stand-ins first on PATH, and where they find this runner (called with the lock held)."""
        return {"PATH": f"{self.door / 'bin'}{os.pathsep}{self._env()['PATH']}",
                "MINITRON_WARM_SOCKET": str(self.door / "socket"),
                "MINITRON_WARM_BIN": str(Path(sys.executable).parent)}

    def _remove_door(self) -> None:
        if self.door is not None:
            shutil.rmtree(self.door, ignore_errors=True)
            self.door = None

    def run(self, argv: list[str], root: Path, separate_stderr: bool = False) -> tuple[int, str, str]:
        """(exit code, output, stderr): stderr is in the output unless ``separate_stderr``."""
        with tempfile.TemporaryDirectory() as tmp:
            out, err = Path(tmp) / "out", Path(tmp) / "err"
            request = {"argv": argv, "cwd": str(root), "env": self._env(), "out": str(out),
                       "err": str(err) if separate_stderr else None}
            with self._lock:
                self._start(root)
                # A script run here may itself call `minitron` (chapter 22's example prints
                # three training commands and their losses): with the stand-ins first on its
                # PATH those calls fork from this runner too, instead of each paying for a
                # fresh interpreter's `import torch`, as they already do in bash commands.
                request["env"].update(self._door_env(), MINITRON_WARM_CPU_LOG=str(Path(tmp) / "cpu"))
                self._proc.stdin.write(json.dumps(request) + "\n")
                self._proc.stdin.flush()
            rc = Path(str(out) + ".rc")
            deadline = time.monotonic() + self.timeout_s
            while not rc.exists():
                if time.monotonic() > deadline:
                    raise PluginError(f"`{' '.join(argv)}` did not finish in {self.timeout_s} s")
                time.sleep(0.02)
            code, cpu = rc.read_text().split()
            called = Path(tmp) / "cpu"   # what its own stand-in calls used (warm_shim.py writes it)
            self.cpu = float(cpu) + (sum(map(float, called.read_text().split())) if called.exists() else 0.0)
            errors = err.read_bytes().decode("utf-8", errors="replace") if separate_stderr and err.exists() else ""
            return int(code), out.read_bytes().decode("utf-8", errors="replace"), errors

    def stop(self) -> None:
        with self._lock:
            if self._proc is not None:
                self._proc.stdin.close()
                self._proc.wait(timeout=30)
                self._proc = None
            self._remove_door()
            self.expected = False
