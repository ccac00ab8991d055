"""Running `minitron` from a test: the real executable, or its entry point in this process.

Every test that runs the command line comes through here, so there is one idea of where the
executable is and of the environment it runs in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

# The executable the venv's install made, beside this interpreter. Where the checkout runs
# uninstalled (the GPU machine: minitron on PYTHONPATH, no console script), the same entry
# point through the interpreter.
MINITRON = str(Path(sys.executable).parent / "minitron")
MINITRON_CMD = [MINITRON] if Path(MINITRON).exists() else [sys.executable, "-m", "minitron"]


def run_minitron(*argv, cwd=None, env=None, timeout: float = 120, here: bool = False) -> subprocess.CompletedProcess:
    """``minitron ARGV`` as a user's shell would run it: text output captured, and (unless
    ``env`` is given) the environment of a CI log or ``2> file`` -- not a terminal, no COLUMNS
    or LINES to widen the output. ``here`` runs the entry point in this process instead
    (minitron_here below): ~20 ms instead of a fresh interpreter's ~0.5 s, for answers that
    start no rank."""
    if env is None:
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
    if here:
        return minitron_here(*argv, cwd=cwd, env=env)
    return subprocess.run([*MINITRON_CMD, *map(str, argv)], capture_output=True, text=True, cwd=cwd, env=env,
                          timeout=timeout)


def minitron_here(*argv, cwd=None, env=None) -> subprocess.CompletedProcess:
    """Run the `minitron` executable's entry point (minitron.cli.main) in this process, with
    ``argv``, ``cwd`` and ``env`` as the executable would get them, and return what a
    subprocess.run(..., capture_output=True, text=True) of it returns: the exit code, stdout,
    stderr (an uncaught exception as Python prints it, so "Traceback" checks still bite).

    For input the command line must refuse: a refusal costs ~20 ms here, ~0.5 s as a fresh
    interpreter (typer, pydantic and the validation imports, every time). A command that got as
    far as starting ranks would fork this process, and its ranks' output would bypass the
    capture: keep the tests of running commands on the real executable, as each table here
    keeps a row or two of its refusals, so the entry point itself stays covered.
    """
    import contextlib
    import io
    import traceback

    from minitron.cli import main
    from minitron.cli.common import console

    out, err = io.StringIO(), io.StringIO()
    # The console is made once per process, its width read then: give it this run's COLUMNS
    # as a fresh `minitron` would read it (80 when there is none and no terminal).
    saved_width = console._width
    columns = (env if env is not None else os.environ).get("COLUMNS", "")
    console._width = int(columns) if columns.isdigit() else None
    saved_argv, saved_cwd, saved_env = sys.argv, os.getcwd(), dict(os.environ)
    code = 0
    try:
        sys.argv = ["minitron", *map(str, argv)]
        if cwd is not None:
            os.chdir(cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                main()
            except SystemExit as exc:
                if isinstance(exc.code, int) or exc.code is None:
                    code = exc.code or 0
                else:  # sys.exit("message"): Python prints it and exits 1
                    print(exc.code, file=sys.stderr)
                    code = 1
            except BaseException:  # noqa: BLE001 -- what the interpreter would print
                traceback.print_exc()
                code = 1
    finally:
        console._width = saved_width
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(saved_env)
    return subprocess.CompletedProcess(["minitron", *map(str, argv)], code, out.getvalue(), err.getvalue())
