import compileall
import gc
import os
import sys

# Compiled once per clone, not once per process: where the environment says not to write
# bytecode (PYTHONDONTWRITEBYTECODE=1, as on the machines CI runs on), each of the suite's
# processes (the workers, the site build, every `minitron` it starts) compiled every module of
# minitron again, and pytest rewrote and compiled every test file in each worker: 0.3 s of CPU
# per process that imports the training path, ~3 s per worker. The files go where Python puts
# them by default (__pycache__/, ignored by git); the processes started later read them, and in a
# fresh clone the controller writes them first (_cache_bytecode).
sys.dont_write_bytecode = False

import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import pytest

# tests/distributed.py (run_ranks), cli_here.py and the other helpers are imported as plain
# modules by the tests.
sys.path.insert(0, str(Path(__file__).parent))

# Every process the tests start, forked ranks and `minitron` subprocesses alike, runs one
# thread: left alone, the launcher gives a one-rank job all the cores, and a model this small
# only pays for the extra threads (they spin waiting for each other: a 1-rank, 3-iteration test
# run took 19 s of CPU with 2 threads on a busy 2-core machine, 6 s with one). The numbers do
# not change: the tests compare runs, and every run now has the same single thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")


def pytest_configure(config):
    if _controller(config):
        _cache_bytecode(config)
        return   # it runs no test: without torch's import it starts the workers 1.3 s sooner
    import torch

    gc.freeze()   # torch's ~170,000 objects, out of the collector's walks: see pytest_collection_finish
    # The launcher forks ranks from this process. A forked child cannot use a thread pool its
    # parent started (the pool's threads do not survive fork), so the pytest process must never
    # start torch's intra-op pool: tests that compute in-process run single-threaded. Each forked
    # rank then sizes its own pool (launch.py sets it from OMP_NUM_THREADS). What the ranks import
    # (torch._dynamo among it) the launcher warms in this process before its first fork.
    torch.set_num_threads(1)

    # This process computes on the CPU, on a machine with GPUs too: the tests that build layers
    # and tensors in it compare them with CPU tensors of their own, and the ranks it forks are
    # CPU ranks whatever it chose (a forked child cannot use CUDA). The tests marked gpu run
    # `minitron` in processes of their own, which choose their device by their backend as a
    # user's would.
    from minitron.accelerator import set_accelerator
    from minitron.accelerator.cpu_accelerator import CPU_Accelerator

    set_accelerator(CPU_Accelerator())


def _controller(config) -> bool:
    """Whether this is pytest-xdist's controller, which deals the tests to workers and runs none."""
    return not hasattr(config, "workerinput") and bool(getattr(config.option, "numprocesses", None))


def _cache_bytecode(config) -> None:
    """(The controller) pytest's rewrite of every test file's asserts, and minitron's bytecode,
    cached once for all workers.

    Each worker collects every test file, and pytest rewrites a file's asserts when it first
    imports it, caching the result in __pycache__. In a fresh clone there is no cache yet and
    the three workers collect at the same moment, so each rewrote all of them (collection takes
    5.3 s of CPU, 2.3 s from the cache), and each compiled minitron. Here a thread of the
    controller, which is otherwise idle, writes both caches while the workers import torch, in
    the order they collect, so they mostly read them: measured on 2 cores with no __pycache__,
    a run of one test (every file collected) went from 13.5-13.9 to 11.8-12.0 s of CPU (8.2 s
    with the caches). It uses pytest's own (private) functions, so what it writes is what a
    worker would; should they change, it stops and the workers rewrite as before.
    """
    def rewrite_all():
        try:
            from _pytest.assertion import rewrite

            state = config.stash[rewrite.assertstate_key]
            for path in sorted(Path(__file__).parent.glob("test_*.py")):
                pyc = rewrite.get_cache_dir(path) / (path.name[:-3] + rewrite.PYC_TAIL)
                if rewrite._read_pyc(path, pyc, state.trace) is None and rewrite.try_makedirs(pyc.parent):
                    source_hash, code = rewrite._rewrite_test(path, config)
                    rewrite._write_pyc(state, code, source_hash, pyc)
            compileall.compile_dir(Path(__file__).parent.parent / "minitron", quiet=2)
        except Exception:   # only a head start: a worker that finds no cache rewrites for itself
            return

    threading.Thread(target=rewrite_all, name="cache-bytecode", daemon=True).start()


# --- three workers (pytest-xdist) ------------------------------------------------------------
# The suite runs in three worker processes (`-n 3` in pyproject's addopts), on machines of two
# cores: much of a test's time is waiting (ranks on each other, launchers on timeouts, a
# debugger's and a hang's timeouts, Ctrl-C tests on signals, Chromium laying out a page), and a
# worker more than the cores fills those waits. Measured on 2 cores with the pages' outputs
# committed: 131-134 s with two workers, 116-120 s with three; the third costs an `import
# torch` and a collection (~4 s of CPU). Workers are dealt whole files (`--dist loadfile`), so a
# file's module fixtures (a training run several tests read) run once: a run that several
# tests read lives in the file of those tests (the 16-rank trace in test_trace16.py).
#
# Why not `--dist loadgroup` with a group per shared fixture, as this suite once did: xdist 3.8
# puts the group into a test's id by setting ``item._nodeid``, which pytest 9.2 no longer
# reads (its ``nodeid`` comes from ``_id``). The groups silently fell apart into single tests,
# dealt one by one to either worker, and a module fixture ran once in each worker that got
# one of its tests: the refusal tables, the browser's visit of every page, training runs.
# tests/test_suite_layout.py checks that every file now runs in one worker.


def _reads_the_site(item) -> bool:
    return "site_build" in getattr(item, "fixturenames", ())


# The order files are dealt in (`--no-loadscope-reorder` keeps this one, rather than xdist's
# "most tests first"): the longest first, so that none of them is left to run alone at the end
# (a few files take 5-13 s of wall time, measured with two workers, most take one or two), then
# the rest as collected. A file missing from LONGEST only runs later, so a new heavy file
# belongs here. Longest by the wall time of a whole two-worker run (this machine, committed page
# outputs), with the files that mostly wait (a debugger's timeout, a hang's, Ctrl-C jobs) set
# between files that compute, so that the workers seldom all wait at the same time.
# The site's readers come first: test_pages_browser.py is the longest file (Chromium visits
# every page), and dealt last, as it once was while the build ran every page's commands, it ran
# on alone for its last 10 s. Dealt first, its worker waits for the build (seconds, the pages'
# outputs being committed) while the build itself keeps that core busy.
LONGEST = ("test_pages_browser.py", "test_moe.py", "test_training_equivalence.py", "test_debug_attach.py",
           "test_torch_fsdp2_checkpoint.py", "test_context_parallel.py", "test_ckpt_devices.py", "test_view.py",
           "test_ckpt_owner.py", "test_hang.py", "test_ds_checkpoint.py", "test_exercises.py", "test_launcher.py",
           "test_docs_hooks.py", "test_moe_sequence_parallel.py", "test_pretrain_deepspeed.py",
           "test_trace_reader.py", "test_ddp_overlap_moe.py", "test_gpt_options.py", "test_estimate_zero.py",
           "test_faults.py", "test_ds_offload.py", "test_layout.py", "test_runtime_engine.py",
           "test_fp8_parallel.py", "test_bad_inputs_flags.py", "test_estimate.py", "test_mtp.py", "test_docs.py")


def pytest_collection_modifyitems(session, config, items):
    def turn(item) -> tuple[int, int]:
        if item.path.name in LONGEST:
            return (0, LONGEST.index(item.path.name))
        return (1, 0)

    items.sort(key=turn)


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """(xdist, in the controller) every worker gets the one folder the site is built into."""
    node.workerinput["minitron_site_scratch"] = str(_site_scratch(node.config))


def _site_scratch(config) -> Path:
    """The folder of this run's site build: one per run, shared by the workers."""
    if hasattr(config, "workerinput"):
        return Path(config.workerinput["minitron_site_scratch"])
    if SITE_SCRATCH not in config.stash:
        config.stash[SITE_SCRATCH] = Path(tempfile.mkdtemp(prefix="minitron-site-"))
    return config.stash[SITE_SCRATCH]


# --- the site build, started early ------------------------------------------------------------
# `mkdocs build --strict` runs every command the pages show: ~85 s of CPU when none of their
# outputs is in docs/page-outputs/ (docs/hooks/page_cache.py), seconds when all are. So the build
# starts as soon as the tests are collected, ahead of the tests, and the tests that read the
# site (the `site_build` fixture: test_docs.py's strict build, test_pages_browser.py's
# measures) only wait for it. Under several workers the first one to finish collecting starts
# it (all collect everything; a folder made with mkdir is the lock), and the files that read
# it may run in another: so the build writes its exit code to a file, and the fixture waits
# for that file rather than for a child of its own. Its commands pick their own ports, as the
# tests do, so the two do not collide; the two of chapter 1 that serve on 29500 (a fixed port
# keeps the page the same) are below the range free ports come from.
def pytest_collection_finish(session):
    # (--collect-only runs no test: a build started there was waited for at the end, minutes.)
    if not session.config.option.collectonly and any(_reads_the_site(item) for item in session.items):
        _start_site_build(session)
    if hasattr(session.config, "workerinput"):
        # The build goes first: the browser's visit of every page waits for it, and where the
        # committed page outputs do not match the code it is the run's longest chain of work
        # (every page's commands); at equal priority it then finished well after the tests,
        # which, much of their time waiting, run as well on what the build leaves. So the
        # workers step back (the build started above keeps the priority it was born with).
        # Every process a test starts inherits this.
        os.nice(WORKER_NICENESS)
    # What collection loaded (torch, minitron, every test module) lives until the worker ends,
    # and the cyclic collector walked all of it on each full collection: 0.2 s a time, up to
    # 1.5 s of CPU in a worker over a run (3.1 s in all the suite's, 2.0 s with this freeze). Frozen, it is never walked again, here or in the processes
    # the tests fork from here; what the tests create is collected as before.
    gc.freeze()


WORKER_NICENESS = 3   # CPU weight 526 against the build's 1024 (Linux's table for nice 3 and 0)


def _start_site_build(session) -> None:
    scratch = _site_scratch(session.config)
    try:
        (scratch / "started").mkdir()
    except FileExistsError:
        return  # the other worker started it
    mkdocs = Path(sys.executable).parent / "mkdocs"
    # Two pages at a time, ahead of the tests (see above): a cold build, as in CI, is the
    # longest single piece of the run's work.
    env = {**os.environ, "MINITRON_DOCS_JOBS": os.environ.get("MINITRON_DOCS_JOBS", "2")}
    build = (f"{shlex.quote(str(mkdocs))} build --strict -d {shlex.quote(str(scratch / 'site'))}"
             f" >{shlex.quote(str(scratch / 'stdout'))} 2>{shlex.quote(str(scratch / 'stderr'))};"
             f" echo $? >{shlex.quote(str(scratch / 'code.tmp'))};"
             f" mv {shlex.quote(str(scratch / 'code.tmp'))} {shlex.quote(str(scratch / 'code'))}")
    process = subprocess.Popen(["sh", "-c", build], env=env, cwd=Path(__file__).resolve().parent.parent,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    session.config.stash[SITE_BUILD] = process


def pytest_sessionstart(session):
    session.config.stash[SESSION_START] = time.time()


def pytest_sessionfinish(session, exitstatus):
    if not hasattr(session.config, "workerinput"):   # the controller: every worker has finished
        from shm_leftovers import remove_leftovers   # DeepSpeed's shm buffers: shm_leftovers.py says why
        remove_leftovers(session.config.stash[SESSION_START] - 1)
    process = session.config.stash.get(SITE_BUILD, None)
    if process is not None and process.poll() is None:
        if session.shouldstop or session.shouldfail or exitstatus == pytest.ExitCode.INTERRUPTED:
            os.killpg(process.pid, 9)  # the suite stopped early (-x, Ctrl-C): the build goes too
        # otherwise the other worker may still be waiting for it
        process.wait()
    if not hasattr(session.config, "workerinput") and SITE_SCRATCH in session.config.stash:
        shutil.rmtree(session.config.stash[SITE_SCRATCH], ignore_errors=True)  # the run's end


SITE_BUILD = pytest.StashKey[subprocess.Popen]()
SESSION_START = pytest.StashKey[float]()
SITE_SCRATCH = pytest.StashKey[Path]()


@pytest.fixture(scope="session")
def site_build(request):
    """The strict build started at collection: (its site folder, exit code, stdout, stderr)."""
    scratch = _site_scratch(request.config)
    code, deadline = scratch / "code", time.monotonic() + 600
    while not code.exists():
        if time.monotonic() > deadline:
            pytest.fail("the site build did not finish within 600 s")
        time.sleep(0.2)
    return scratch / "site", int(code.read_text()), (scratch / "stdout").read_text(), (scratch / "stderr").read_text()


# --- where the CPU goes (opt-in) --------------------------------------------------------------
# MINITRON_TEST_CPU=FILE appends one line per test: user and system CPU seconds of this worker,
# user and system CPU seconds of the processes it waited for during the test (forked ranks,
# `minitron` subprocesses), wall seconds, node id. Wall time on a shared machine mostly measures
# the neighbours; CPU is what the suite's budget is made of, and system time is a third of it
# (forks, page faults, gloo's sockets), so it is kept apart. Sum by file:
#   awk '{split($6,f,"::"); s[f[1]]+=$1+$2+$3+$4} END {for(k in s) print s[k], k}' FILE
# (Not in it: the site build's page commands, which MINITRON_DOCS_TIMES records, and Chromium.)
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    target = os.environ.get("MINITRON_TEST_CPU")
    if not target:
        yield
        return
    import resource

    def usage() -> list[float]:
        own, waited = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
        return [own.ru_utime, own.ru_stime, waited.ru_utime, waited.ru_stime, time.perf_counter()]

    before = usage()
    yield
    spent = [after - then for after, then in zip(usage(), before)]
    with open(target, "a") as out:
        out.write(" ".join(f"{x:.3f}" for x in spent) + f" {item.nodeid}\n")
