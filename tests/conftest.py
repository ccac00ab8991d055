import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import torch

# tests/distributed.py (run_ranks) is imported as a plain module by the distributed tests.
sys.path.insert(0, str(Path(__file__).parent))
from cli_here import run_minitron  # noqa: E402  (found through the line above)

# The launcher forks ranks from this process. A forked child cannot use a thread pool its
# parent started (the pool's threads do not survive fork), so the pytest process must never
# start torch's intra-op pool: tests that compute in-process run single-threaded. Each forked
# rank then sizes its own pool (launch.py sets it from OMP_NUM_THREADS). What the ranks import
# (torch._dynamo among it) the launcher warms in this process before its first fork.
torch.set_num_threads(1)
# And so does every process the tests start, forked ranks and `minitron` subprocesses alike:
# left alone, the launcher gives a one-rank job all the cores, and a model this small only
# pays for the extra threads (they spin waiting for each other: a 1-rank, 3-iteration test
# run took 19 s of CPU with 2 threads on a busy 2-core machine, 6 s with one). The numbers do
# not change: the tests compare runs, and every run now has the same single thread.
os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def trace16(tmp_path_factory):
    """`minitron trace --tp 2 --pp 4 --world 16`, the README's main job, run once for every test
    that reads it: test_trace16 reads its files, test_readme its output at the 100 columns the
    README's excerpt was taken at. The command exactly as written: on a CPU machine it picks
    gloo, and asking the accelerator shows in the trace (validate_args calls get_accelerator
    only when --backend is not given). On a GPU machine it is told gloo: 16 NCCL ranks would
    need 16 GPUs. Returns the trace directory and the finished process."""
    cwd = tmp_path_factory.mktemp("trace16")
    env = {**os.environ, "COLUMNS": "100"}
    gloo = ["--backend", "gloo"] if torch.cuda.is_available() else []
    proc = run_minitron("trace", "--tp", "2", "--pp", "4", "--world", "16", *gloo, cwd=cwd, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return cwd / "minitron-trace", proc


# --- the site build, started early ------------------------------------------------------------
# `mkdocs build --strict` runs every command the pages show: about a minute and a half of one
# core when none of their outputs is in .cache/pages/ (docs/hooks/page_cache.py), seconds when
# all are. The rest of the suite leaves the second core idle much of the time (ranks waiting on
# each other, launchers on timeouts, Ctrl-C tests on signals), so the build starts as soon as
# the tests are collected and the tests that read the site (the `site_build` fixture:
# test_docs.py's strict build, test_pages_browser.py's measures) only wait for it. Its commands
# pick their own ports, as the tests do, so the two do not collide; the two of chapter 1 that
# serve on 29500 (a fixed port keeps the page the same) are below the range free ports come from.
def _reads_the_site(item) -> bool:
    return "site_build" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(session, config, items):
    # The tests that read the build go last, so waiting for it holds nothing else up.
    items.sort(key=_reads_the_site)


def pytest_collection_finish(session):
    if not any(_reads_the_site(item) for item in session.items):
        return
    scratch = Path(tempfile.mkdtemp(prefix="minitron-site-"))
    out, err = open(scratch / "stdout", "w"), open(scratch / "stderr", "w")
    mkdocs = Path(sys.executable).parent / "mkdocs"
    # One page at a time, and niced: the tests' own waits (ranks, timeouts, signals) leave
    # a core idle much of the time, and the build should fill those gaps, not slow the tests.
    env = {**os.environ, "MINITRON_DOCS_JOBS": os.environ.get("MINITRON_DOCS_JOBS", "1")}
    process = subprocess.Popen(["nice", "-n", "10", str(mkdocs), "build", "--strict", "-d", str(scratch / "site")],
                               env=env,
                               cwd=Path(__file__).resolve().parent.parent, stdout=out, stderr=err,
                               stdin=subprocess.DEVNULL, start_new_session=True)
    session.config.stash[SITE_BUILD] = (scratch, process)


def pytest_sessionfinish(session):
    scratch, process = session.config.stash.get(SITE_BUILD, (None, None))
    if process is None:
        return
    if process.poll() is None:  # the suite stopped early (-x, Ctrl-C): the build goes too
        os.killpg(process.pid, 9)
        process.wait()
    shutil.rmtree(scratch, ignore_errors=True)


SITE_BUILD = pytest.StashKey[tuple]()


@pytest.fixture(scope="session")
def site_build(request):
    """The strict build started at collection: (its site folder, exit code, stdout, stderr)."""
    scratch, process = request.config.stash[SITE_BUILD]
    code = process.wait(timeout=600)
    return scratch / "site", code, (scratch / "stdout").read_text(), (scratch / "stderr").read_text()
