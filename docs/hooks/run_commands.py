"""MkDocs hook: a line ``<!-- run: COMMAND -->`` becomes COMMAND's real output, and a line
``<!-- figure: COMMAND -->`` becomes the SVG picture that COMMAND prints.

Why: every group list, call tree or help text on the site must be what the code prints today,
not what it printed when someone pasted it. So the pages hold the command, and the build runs
it. A command that fails fails the build, naming the page and the command, which makes a stale
page impossible to publish.

This file is the build's side: which commands run, and when. A command runs

* once per build: a second page asking for the same command gets the first answer;
* not at all when nothing it depends on has changed since a build that ran it: a page's
  outputs are kept in ``docs/page-outputs/`` (committed) under a hash of its commands and of
  the sources they run (docs/hooks/page_cache.py says what counts);
* ahead of time, a few at once: as soon as the build knows its pages, every page's commands
  start, ``MINITRON_DOCS_JOBS`` pages at a time (default: the number of CPUs, at least 2).
  The commands of one page run in page order, so a command may read what an earlier command
  *on the same page* wrote; commands on different pages may run at the same moment, so two
  pages must not write the same path with different commands.

How one command runs (its folder, its environment, bash or the warm runner, the paths its
output may show): docs/hooks/command_run.py. How an output is shown, and how run lines are
found: docs/hooks/page_text.py.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import os
import re
import subprocess
import sys
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from mkdocs.exceptions import PluginError

# command -> its output, as a Future: set once the command has run, waited on by anyone else.
_cache: dict[str, Future] = {}
_cache_lock = threading.Lock()
_pool: ThreadPoolExecutor | None = None
# page -> (its cache key, its commands), and page -> its outputs found in the cache.
_keys: dict[str, tuple[str, list[str]]] = {}
_cached: dict[str, list[str]] = {}

# The modules beside this file, as one package made afresh each time this hook is loaded.
PACKAGE = "minitron_docs_hooks"


def _load_siblings(*names: str) -> list:
    """The modules of docs/hooks/ that ``names`` name. MkDocs loads a hook by its path, not as
    a package, so the folder is made a package here, and its modules import one another
    relatively (``from . import page_text``). Made afresh on every load: ``mkdocs serve``
    loads the hooks again for each rebuild, which must see an edited sibling too, and each
    load (a test's) starts with no command run and no warm runner."""
    for name in [name for name in sys.modules if name == PACKAGE or name.startswith(PACKAGE + ".")]:
        del sys.modules[name]
    spec = importlib.machinery.ModuleSpec(PACKAGE, None, is_package=True)
    spec.submodule_search_locations = [str(Path(__file__).parent)]
    sys.modules[PACKAGE] = importlib.util.module_from_spec(spec)
    return [importlib.import_module(f"{PACKAGE}.{name}") for name in names]


page_cache, page_text, command_run = _load_siblings("page_cache", "page_text", "command_run")
# The page side and the command side, under the names the build and the tests use.
WIDTH, clean, fenced, fold, figure = (page_text.WIDTH, page_text.clean, page_text.fenced, page_text.fold,
                                      page_text.figure)
scan, run_commands = page_text.scan, page_text.run_commands
CHECKOUT_SHOWN_AS, command_env, debug_ports = (command_run.CHECKOUT_SHOWN_AS, command_run.command_env,
                                               command_run.debug_ports)
execute, places, scratch_dir = command_run.execute, command_run.places, command_run.scratch_dir


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
    command_run.epoch.clear()
    command_run.close()


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


def on_files(files, config):
    """Find each page's outputs in the cache, and start the commands of the pages that are not
    there now, so they run while other pages are being rendered."""
    global _pool
    if "--dirty" in sys.argv:
        return files  # `serve --dirty` renders only changed pages: run only what they ask for
    root = Path(config.config_file_path).parent
    command_run.epoch["SOURCE_DATE_EPOCH"] = os.environ.get("SOURCE_DATE_EPOCH") or source_date_epoch(root)
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
            outputs = page_cache.load(root, key, command_run.epoch["SOURCE_DATE_EPOCH"])
            if outputs is not None and len(outputs) == len(commands):
                _cached[file.src_uri] = outputs
                continue
        work.append((file.src_uri, commands))
    command_run.warm.expected = bool(work)
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
    command_run.close()
    if _keys:  # a whole build: what it did not ask for belongs to older code
        page_cache.prune(Path(config.config_file_path).parent, {key for key, _ in _keys.values()})


def on_build_error(error):
    _stop_pool()  # do not keep running commands for a build that has already failed
    command_run.close()


def _stop_pool() -> None:
    global _pool
    if _pool is not None:
        _pool.shutdown(wait=False, cancel_futures=True)
        _pool = None


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
        page_cache.store(root, key, name, commands, outputs, command_run.epoch.get("SOURCE_DATE_EPOCH", ""))
    return expanded
