"""How one command of a page runs: where, with what environment, through bash or warm, and
how the build machine's paths in its output are shown (for run_commands.py, which decides
which commands run, and when).

How a command runs:

* through bash, so ``&&`` and pipes work, in the build's *scratch directory*: a fresh folder
  made for this build (and removed after it) in which every top-level entry of the repository
  root (the folder of mkdocs.yml) appears as a link. A command reads ``docs/examples/x.py`` or
  ``scripts/y.py`` as from the root, and writes (``minitron trace --out sched4``) into the
  scratch folder, never into the checkout; what it prints names its files as a reader's own run
  would (``sched4/trace.json``), not by a path of the build machine. The scratch folder's path,
  should an output still print it, is cut to a relative one, and the checkout's path is shown as
  ``/path/to/minitron``: no page carries a path of the machine that built it;
* with the directory of the Python running MkDocs (the venv's ``bin``) first on PATH, so
  ``minitron`` is the one installed in this checkout;
* with ``COLUMNS=120`` (``WIDTH``) and ``NO_COLOR=1``: rich and typer then draw the same tables
  at the same width on every machine, and that width is what a code block of the page holds
  at a laptop's width (1280 px; docs/stylesheets/output.css sets the page up for it, and
  tests/test_pages_browser.py measures it in Chromium). A line that is still wider (a
  one-line error message, a long list) is folded at spaces, never set in a smaller font.
  Any colour codes left are stripped;
* with ``SOURCE_DATE_EPOCH`` set to the time of the last commit of the code the commands run,
  unless the build's environment sets it: the training log prints that instead of the clock,
  so the same code gives the same pages;
* with ``DEBUG_PORT_BASE`` set, when the command names it, to a base of free ports (rank R's
  debug adapter listens on BASE + R): a fixed base would collide when two builds run at once.
  The output shows those ports as the default base's (5678 + R), what the reader's own run
  without ``--debug-port-base`` prints;
* with ``OMP_NUM_THREADS=1`` unless the build's environment sets it: one compute thread per
  process, as the pages' tiny models need (the printed numbers are the same either way);

A command's ``minitron`` and ``python`` calls run from a warm interpreter (warm_client.py,
warm_runner.py): the same output, without an ``import torch`` per call.
"""

from __future__ import annotations

import functools
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from mkdocs.exceptions import PluginError

from .page_text import WIDTH, clean
from .warm_client import WarmRunner

log = logging.getLogger("mkdocs.hooks.run_commands")

TIMEOUT_S = 180
CHECKOUT_SHOWN_AS = "/path/to/minitron"

# repository root -> this build's scratch directory (see the module docstring).
_scratch: dict[Path, Path] = {}
_scratch_lock = threading.Lock()
epoch: dict[str, str] = {}  # "SOURCE_DATE_EPOCH" -> its value for this build, once known (on_files)


def scratch_dir(root: Path) -> Path:
    """This build's working directory for commands: fresh, with the root's entries linked in."""
    root = Path(root).resolve()
    with _scratch_lock:
        if root not in _scratch:
            scratch = Path(tempfile.mkdtemp(prefix="minitron-docs-"))
            for name in _source_entries(root):
                (scratch / name).symlink_to(root / name)
            _scratch[root] = scratch
        return _scratch[root]


def _source_entries(root: Path) -> set[str]:
    """The root's top-level names that belong to the sources: in a git checkout the ones git
    tracks, so that an earlier run's `minitron-trace/` or a built `site/` lying in the checkout
    is not linked in (a command would write into it, or read what it left)."""
    done = subprocess.run(["git", "-C", str(root), "ls-files", "-z"], capture_output=True)
    if done.returncode == 0 and done.stdout:
        return {path.split("/", 1)[0] for path in done.stdout.decode().split("\0") if path}
    return {entry.name for entry in root.iterdir() if not entry.name.startswith(".") and entry.name != "site"}


def close() -> None:
    """A build's end, or a new build's start: stop the warm runner, remove the scratch folders
    (the next command makes a fresh one)."""
    warm.stop()
    with _scratch_lock:
        for scratch in _scratch.values():
            shutil.rmtree(scratch, ignore_errors=True)
        _scratch.clear()


def command_env() -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.update(COLUMNS=str(WIDTH), NO_COLOR="1", TERM="dumb", PYTHONUNBUFFERED="1")
    if epoch.get("SOURCE_DATE_EPOCH"):
        env["SOURCE_DATE_EPOCH"] = epoch["SOURCE_DATE_EPOCH"]
    # One compute thread per process unless told otherwise: the pages' models are tiny, and a
    # one-rank run given every core only pays for threads that spin waiting for each other.
    env.setdefault("OMP_NUM_THREADS", "1")
    for var in ("FORCE_COLOR", "CLICOLOR_FORCE", "PY_COLORS"):
        env.pop(var, None)
    return env


# The build's warm runner, started by the first command that asks for it; close() stops it.
warm = WarmRunner(command_env, TIMEOUT_S)


def places(root: Path) -> dict[str, str]:
    """The build machine's paths an output may print, and how a page shows them (longest first).
    The commands' minitron may be installed from another folder than the root (site-packages,
    another checkout): its folder is a path of this machine too, shown as the checkout's."""
    scratch = scratch_dir(root)
    shown = {f"{scratch}/": "", str(scratch): "."}
    for folder in {Path(root).resolve(), installed_checkout(command_env().get("PYTHONPATH", ""))} - {None}:
        shown.update({f"{folder}/": "", str(folder): CHECKOUT_SHOWN_AS})
    # The stand-ins' folder (warm_shim.py) first, as the folder of the programs they stand in
    # for (`command -v python` names the venv's, as in a reader's shell), which is then shown
    # as above.
    door = warm.door
    stand_ins = {str(door / "bin"): str(Path(sys.executable).parent)} if door is not None else {}
    return {**stand_ins, **dict(sorted(shown.items(), key=lambda item: -len(item[0])))}


@functools.lru_cache(maxsize=4)
def installed_checkout(pythonpath: str) -> Path | None:
    """The folder above the minitron package that the commands import, as a console script
    finds it (the script's own folder first, not the current one); None if there is none.
    Asked of a child Python with the commands' environment: the build's own sys.path may differ."""
    probe = ("import sys, importlib.util; del sys.path[0]; spec = importlib.util.find_spec('minitron'); "
             "print(spec.submodule_search_locations[0] if spec else '')")
    done = subprocess.run([sys.executable, "-c", probe], env=command_env(), capture_output=True, text=True,
                          cwd=tempfile.gettempdir())
    folder = done.stdout.strip()
    return Path(folder).resolve().parent if done.returncode == 0 and folder else None


DEBUG_PORTS = 8   # ranks a page's debug command may make wait: BASE .. BASE + 7


def debug_ports(command: str) -> tuple[dict[str, str], dict[str, str]]:
    """(variables, places) for COMMAND: if it names $DEBUG_PORT_BASE, that variable set to a
    base of free ports, and each of those ports shown as the default base's; else nothing."""
    if "$DEBUG_PORT_BASE" not in command and "${DEBUG_PORT_BASE}" not in command:
        return {}, {}
    from minitron.launcher.debug import DEFAULT_PORT_BASE
    from minitron.launcher.ports import free_port

    base = free_port(count=DEBUG_PORTS)
    shown = {f":{base + r}": f":{DEFAULT_PORT_BASE + r}" for r in range(DEBUG_PORTS)}
    return {"DEBUG_PORT_BASE": str(base)}, shown


def execute(command: str, page: str, root: Path) -> str:
    started = time.perf_counter()
    cwd = scratch_dir(root)
    variables, ports_shown = debug_ports(command)
    # A command with a variable to expand is bash's (warm_plan refuses `$` as well).
    plan = None if variables else warm.module.warm_plan(command, str(Path(sys.executable).parent))
    cpu, done = 0.0, None
    if plan is not None:  # program calls only: fork each from the warm interpreter, as && would
        done, cpu = run_warm(plan, cwd)
    if done is None:
        # stderr joins stdout, as in a terminal; unbuffered Python keeps their order. Its
        # `minitron` and `python` calls run warm all the same (warm_shim.py): their CPU comes
        # back in a file, as bash never waits for the forked children that did the work.
        with tempfile.NamedTemporaryFile(prefix="minitron-warm-cpu-") as warm_cpu:
            # (A command that names neither runs without them: starting the warm runner costs
            # an `import torch`, more than `cat` or `printf` ever will.)
            stand_ins = warm.shim_env(root) if STAND_IN_NAMES.search(command) else {}
            env = {**command_env(), **variables, **stand_ins, "MINITRON_WARM_CPU_LOG": warm_cpu.name}
            bash = subprocess.Popen(["bash", "-c", command], cwd=cwd, env=env, start_new_session=True,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
            timer = threading.Timer(TIMEOUT_S, _stop_group, (bash,))
            timer.start()
            output = bash.stdout.read().decode("utf-8", errors="replace")
            # wait4, not wait: it also says how much CPU the command (and all it waited for) used.
            _, status, usage = os.wait4(bash.pid, 0)
            bash.returncode = os.waitstatus_to_exitcode(status)
            bash.stdout.close()
            if not timer.is_alive():
                raise PluginError(f"{page}: `{command}` did not finish in {TIMEOUT_S} s")
            timer.cancel()
            cpu += sum(float(line) for line in Path(warm_cpu.name).read_text().split())
        done, cpu = (bash.returncode, output), cpu + usage.ru_utime + usage.ru_stime
    returncode, output = done
    if returncode != 0:
        tail = "\n".join(clean(output, {**places(root), **ports_shown}).splitlines()[-20:])
        raise PluginError(
            f"{page}: the command in `<!-- run: {command} -->` exited with code "
            f"{returncode}; fix the command or the code it runs. Its last output:\n{tail}"
        )
    wall = time.perf_counter() - started
    log.debug("ran `%s` for %s in %.2f s (%.2f s of CPU)", command, page, wall, cpu)
    if os.environ.get("MINITRON_DOCS_TIMES"):  # a file: one line per command, to find the costly ones
        with open(os.environ["MINITRON_DOCS_TIMES"], "a") as times:
            times.write(f"{wall:7.2f} {cpu:7.2f} {'warm' if plan is not None else 'bash'} {page} {command}\n")
    return clean(output, {**places(root), **ports_shown})


# The programs warm_shim.py stands in for, as words of a command.
STAND_IN_NAMES = re.compile(r"(?<![\w./-])(minitron|python3?)(?![\w./-])")


def _stop_group(bash: subprocess.Popen) -> None:
    """The time limit: bash's whole process group is told to stop (a stand-in among it stops
    the warm child it waits for), then bash itself is killed."""
    try:
        os.killpg(bash.pid, 15)
    except OSError:
        pass
    bash.kill()


def run_warm(plan, cwd: Path) -> tuple[tuple[int, str] | None, float]:
    """((exit code, output) as bash would give them, CPU seconds) of a warm_plan; None instead
    of the pair where bash must run it after all: the piped call failed (a pipe's exit code is
    its filter's, and bash's output would show the failure) or wrote to stderr (in bash that
    text passes the filter by, and where it lands among the filtered lines is bash's timing)."""
    steps, pipe, or_exit_code = plan
    returncode, shown, cpu = 0, [], 0.0
    for i, (argv, silenced) in enumerate(steps):
        piped = pipe is not None and i == len(steps) - 1
        returncode, output, errors = warm.run(argv, cwd, separate_stderr=piped and not pipe[1])
        cpu += warm.cpu
        if piped:
            if returncode != 0 or errors:
                return None, cpu
            filtered = subprocess.run(pipe[0], input=output.encode(), cwd=cwd, env=command_env(),
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            returncode, output = filtered.returncode, filtered.stdout.decode("utf-8", errors="replace")
        if returncode != 0 or not silenced:
            shown.append(output)
        if returncode != 0:
            break
    if or_exit_code and returncode != 0:
        shown.append(f"(exit code {returncode})\n")
        returncode = 0
    return (returncode, "".join(shown)), cpu
