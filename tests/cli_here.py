"""The `minitron` entry point run inside the test process, for tables of refused input."""

from __future__ import annotations

import subprocess
import sys


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
    import os
    import traceback

    from minitron.cli import main

    out, err = io.StringIO(), io.StringIO()
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
        sys.argv = saved_argv
        os.chdir(saved_cwd)
        if env is not None:
            os.environ.clear()
            os.environ.update(saved_env)
    return subprocess.CompletedProcess(["minitron", *map(str, argv)], code, out.getvalue(), err.getvalue())
