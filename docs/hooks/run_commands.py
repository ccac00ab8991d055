"""MkDocs hook: a line ``<!-- run: COMMAND -->`` becomes COMMAND's real output, and a line
``<!-- figure: COMMAND -->`` becomes the SVG picture that COMMAND prints.

Why: every group list, call tree or help text on the site must be what the code prints today,
not what it printed when someone pasted it. So the pages hold the command, and the build runs
it. A command that fails fails the build, naming the page and the command, which makes a stale
page impossible to publish.

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
* once per build: a second page asking for the same command gets the first answer;
* not at all when nothing it depends on has changed since a build that ran it: a page's
  outputs are kept in ``.cache/pages/`` under a hash of its commands and of the sources they
  run (docs/hooks/page_cache.py says what counts);
* ahead of time, a few at once: as soon as the build knows its pages, every page's commands
  start, ``MINITRON_DOCS_JOBS`` pages at a time (default: the number of CPUs, at least 2).
  The commands of one page run in page order, so a command may read what an earlier command
  *on the same page* wrote; commands on different pages may run at the same moment, so two
  pages must not write the same path with different commands.

How an output is shown, and how run lines are found: docs/hooks/page_text.py.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from mkdocs.exceptions import PluginError

log = logging.getLogger("mkdocs.hooks.run_commands")

TIMEOUT_S = 180
CHECKOUT_SHOWN_AS = "/path/to/minitron"

# command -> its output, as a Future: set once the command has run, waited on by anyone else.
_cache: dict[str, Future] = {}
_cache_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
# repository root -> this build's scratch directory (see the module docstring).
_scratch: dict[Path, Path] = {}
_scratch_lock = threading.Lock()
# page -> (its cache key, its commands), and page -> its outputs found in the cache.
_keys: dict[str, tuple[str, list[str]]] = {}
_cached: dict[str, list[str]] = {}
_epoch: dict[str, str] = {}  # "SOURCE_DATE_EPOCH" -> its value for this build, once known


def _load_sibling(name: str):
    """A module of docs/hooks/ (the hooks are loaded by path, not as a package)."""
    path = Path(__file__).with_name(f"{name}.py")
    spec = importlib.util.spec_from_file_location(f"minitron_docs_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


page_cache = _load_sibling("page_cache")
page_text = _load_sibling("page_text")
# The page side, under the names the build (and tests/test_docs.py) use.
WIDTH, clean, fenced, fold, figure = page_text.WIDTH, page_text.clean, page_text.fenced, page_text.fold, page_text.figure
scan, run_commands = page_text.scan, page_text.run_commands


def on_config(config):
    """Anchor relative snippet base paths at the repo root, so a build from elsewhere works."""
    root = Path(config.config_file_path).parent
    snippets = config.mdx_configs.get("pymdownx.snippets")
    if snippets and "base_path" in snippets:
        paths = snippets["base_path"]
        paths = [paths] if isinstance(paths, str) else paths
        snippets["base_path"] = [str((root / p).resolve()) for p in paths]
    return config


def on_pre_build(config):
    # A new build (also each rebuild under `mkdocs serve`) must see the code as it is now.
    _stop_pool()
    _cache.clear()
    _keys.clear()
    _cached.clear()
    _epoch.clear()
    _warm.stop()
    _remove_scratch()


def source_date_epoch(root: Path) -> str:
    """The committer time of the last commit that changed the code the commands run: what the
    training log prints instead of the clock. Without git history (a copy of the tree, as
    .ci/run makes one), the newest modification time among those files, which a copy keeps:
    the same for every build of the same tree, like the commit time."""
    done = subprocess.run(["git", "-C", str(root), "log", "-1", "--format=%ct", "--", *page_cache.SOURCES],
                          capture_output=True, text=True)
    if done.returncode == 0 and done.stdout.strip():
        return done.stdout.strip()
    paths = [root / source for source in page_cache.SOURCES]
    files = [p for path in paths for p in ([path] if path.is_file() else path.rglob("*"))
             if p.is_file() and "__pycache__" not in p.parts]   # Python writes those as it runs
    return str(int(max((p.stat().st_mtime for p in files), default=0)))


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


def _remove_scratch() -> None:
    with _scratch_lock:
        for scratch in _scratch.values():
            shutil.rmtree(scratch, ignore_errors=True)
        _scratch.clear()


def on_files(files, config):
    """Find each page's outputs in the cache, and start the commands of the pages that are not
    there now, so they run while other pages are being rendered."""
    global _pool
    if "--dirty" in sys.argv:
        return files  # `serve --dirty` renders only changed pages: run only what they ask for
    root = Path(config.config_file_path).parent
    _epoch["SOURCE_DATE_EPOCH"] = os.environ.get("SOURCE_DATE_EPOCH") or source_date_epoch(root)
    checkout = page_cache.checkout_files(root)
    context = {**page_cache.environment(), "width": str(WIDTH)}
    digest = page_cache.sources_digest(root, checkout, context)
    jobs = int(os.environ.get("MINITRON_DOCS_JOBS", max(2, os.cpu_count() or 1)))
    work = []
    for file in files.documentation_pages():
        commands = run_commands(Path(file.abs_src_path).read_text(encoding="utf-8"))
        if not commands:
            continue
        if page_cache.enabled():
            key = page_cache.page_key(root, digest, set(checkout), commands)
            _keys[file.src_uri] = key, commands
            outputs = page_cache.load(root, key, _epoch["SOURCE_DATE_EPOCH"])
            if outputs is not None and len(outputs) == len(commands):
                _cached[file.src_uri] = outputs
                continue
        work.append((file.src_uri, commands))
    _warm.expected = bool(work)
    if jobs > 1 and work:
        _pool = ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="docs-run")
        # The costliest pages first: a page's commands run one after another, so a long page
        # started last ran on alone while the other threads had nothing left (chapters 14 and
        # 18, the longest, come late in file order).
        for page, commands in sorted(work, key=lambda item: -estimated_cost(item[1])):
            _pool.submit(_prefetch, commands, page, root)
    return files


def estimated_cost(commands: list[str]) -> int:
    """A page's commands' cost, roughly, before any has run (a cold build knows no timings):
    one per command, more for one that trains (ranks take steps) or runs a script of the
    repository. Only the order of the pages depends on it."""
    return sum(1 + 3 * bool(TRAINS.search(command)) + 2 * bool(RUNS_A_SCRIPT.search(command))
               for command in commands)


TRAINS = re.compile(r"\bpretrain\b|--steps\b|--train-iters\b")
RUNS_A_SCRIPT = re.compile(r"\bpython3? (docs/examples|scripts|tests)/")


def _prefetch(commands: list[str], page: str, root: Path) -> None:
    for command in commands:
        try:
            run(command, page, root)
        except PluginError:
            return  # reported when the page itself asks for this command


def on_post_build(config):
    _stop_pool()
    _warm.stop()
    _remove_scratch()
    if _keys:  # a whole build: what it did not ask for belongs to older code
        page_cache.prune(Path(config.config_file_path).parent, {key for key, _ in _keys.values()})


def on_build_error(error):
    _stop_pool()  # do not keep running commands for a build that has already failed
    _warm.stop()
    _remove_scratch()


def _stop_pool() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None


def command_env() -> dict[str, str]:
    env = dict(os.environ)
    bin_dir = str(Path(sys.executable).parent)
    env["PATH"] = bin_dir + os.pathsep + env.get("PATH", "")
    env.update(COLUMNS=str(WIDTH), NO_COLOR="1", TERM="dumb", PYTHONUNBUFFERED="1")
    if _epoch.get("SOURCE_DATE_EPOCH"):
        env["SOURCE_DATE_EPOCH"] = _epoch["SOURCE_DATE_EPOCH"]
    # One compute thread per process unless told otherwise: the pages' models are tiny, and a
    # one-rank run given every core only pays for threads that spin waiting for each other.
    env.setdefault("OMP_NUM_THREADS", "1")
    for var in ("FORCE_COLOR", "CLICOLOR_FORCE", "PY_COLORS"):
        env.pop(var, None)
    return env


def run(command: str, page: str, root: Path) -> str:
    """COMMAND's cleaned output; runs it unless this build already has (or is doing so)."""
    with _cache_lock:
        future = _cache.get(command)
        owner = future is None
        if owner:
            future = _cache[command] = Future()
    if owner:
        try:
            future.set_result(execute(command, page, root))
        except BaseException as exc:  # the waiting pages get the same error
            future.set_exception(exc)
    return future.result()


class _WarmRunner:
    """The helper process of warm_runner.py, started on first use and stopped with the build."""

    def __init__(self):
        self._proc = None
        self._lock = threading.Lock()
        self.module = _load_sibling("warm_runner")
        self.path = Path(self.module.__file__)
        self.door = None  # the folder of its socket and of the stand-ins (warm_shim.py), once started
        # A build with commands to run sets this (on_files): its bash commands start the helper
        # for their stand-ins. Otherwise (one page expanded on its own, as tests do) they use
        # it only if it is running already: starting it costs an `import torch`, which one
        # command that bash runs pays at most once.
        self.expected = False

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
                                      cwd=root, env=command_env(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
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
        return {"PATH": f"{self.door / 'bin'}{os.pathsep}{command_env()['PATH']}",
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
            request = {"argv": argv, "cwd": str(root), "env": command_env(), "out": str(out),
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
            deadline = time.monotonic() + TIMEOUT_S
            while not rc.exists():
                if time.monotonic() > deadline:
                    raise PluginError(f"`{' '.join(argv)}` did not finish in {TIMEOUT_S} s")
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


_warm = _WarmRunner()


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
    door = _warm.door
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
    plan = None if variables else _warm.module.warm_plan(command, str(Path(sys.executable).parent))
    cpu, done = 0.0, None
    if plan is not None:  # program calls only: fork each from the warm interpreter, as && would
        done, cpu = _run_warm(plan, cwd)
    if done is None:
        # stderr joins stdout, as in a terminal; unbuffered Python keeps their order. Its
        # `minitron` and `python` calls run warm all the same (warm_shim.py): their CPU comes
        # back in a file, as bash never waits for the forked children that did the work.
        with tempfile.NamedTemporaryFile(prefix="minitron-warm-cpu-") as warm_cpu:
            # (A command that names neither runs without them: starting the warm runner costs
            # an `import torch`, more than `cat` or `printf` ever will.)
            stand_ins = _warm.shim_env(root) if STAND_IN_NAMES.search(command) else {}
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


def _run_warm(plan, cwd: Path) -> tuple[tuple[int, str] | None, float]:
    """((exit code, output) as bash would give them, CPU seconds) of a warm_plan; None instead
    of the pair where bash must run it after all: the piped call failed (a pipe's exit code is
    its filter's, and bash's output would show the failure) or wrote to stderr (in bash that
    text passes the filter by, and where it lands among the filtered lines is bash's timing)."""
    steps, pipe, or_exit_code = plan
    returncode, shown, cpu = 0, [], 0.0
    for i, (argv, silenced) in enumerate(steps):
        piped = pipe is not None and i == len(steps) - 1
        returncode, output, errors = _warm.run(argv, cwd, separate_stderr=piped and not pipe[1])
        cpu += _warm.cpu
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


def expand(markdown: str, page: str, root: Path, outputs: list[str] | None = None) -> str:
    """The page with each run line replaced by its output: taken from ``outputs`` (the page's
    outputs in page order, from the cache) if given, else from running the command."""
    known = iter(outputs) if outputs is not None else None
    out: list[str] = []
    for line, match in scan(markdown):
        if match is None:
            out.append(line)
            continue
        if not match["command"]:
            raise PluginError(f"{page}: an empty `<!-- {match['kind']}: -->` line; give it a command")
        text = next(known) if known is not None else run(match["command"], page, root)
        if match["kind"] == "figure":
            out.extend(figure(text, match["indent"], page, match["command"]))
        else:
            out.extend(fenced(text, match["indent"]))
    return "\n".join(out)


def on_page_markdown(markdown, page, config, files):
    root = Path(config.config_file_path).parent
    name = page.file.src_uri
    key, commands = _keys.get(name, (None, None))
    if commands != run_commands(markdown):
        key = None  # the page is not what on_files read (`serve --dirty`): run it, keep nothing
    expanded = expand(markdown, name, root, _cached.get(name) if key else None)
    if key and name not in _cached:  # every command has run by now: run() only looks them up
        outputs = [run(command, name, root) for command in commands]
        page_cache.store(root, key, name, commands, outputs, _epoch.get("SOURCE_DATE_EPOCH", ""))
    return expanded
