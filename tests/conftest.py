import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

# tests/distributed.py (run_ranks) is imported as a plain module by the distributed tests.
sys.path.insert(0, str(Path(__file__).parent))

# The launcher forks ranks from this process. A forked child cannot use a thread pool its
# parent started (the pool's threads do not survive fork), so the pytest process must never
# start torch's intra-op pool: tests that compute in-process run single-threaded. Each forked
# rank then sizes its own pool (launch.py sets it from OMP_NUM_THREADS). What the ranks import
# (torch._dynamo among it) the launcher warms in this process before its first fork.
torch.set_num_threads(1)


@pytest.fixture(scope="session")
def trace16(tmp_path_factory):
    """`minitron trace --tp 2 --pp 4 --world 16`, the README's main job, run once for every test
    that reads it: test_trace16 reads its files, test_readme its output at the 100 columns the
    README's excerpt was taken at. (--backend gloo: what the command picks on a CPU machine.)
    Returns the trace directory and the finished process."""
    cwd = tmp_path_factory.mktemp("trace16")
    env = {**os.environ, "COLUMNS": "100"}
    proc = subprocess.run([str(Path(sys.executable).parent / "minitron"), "trace", "--tp", "2", "--pp", "4",
                           "--world", "16", "--backend", "gloo"],
                          cwd=cwd, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return cwd / "minitron-trace", proc
