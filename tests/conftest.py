import sys
from pathlib import Path

import torch

# tests/distributed.py (run_ranks) is imported as a plain module by the distributed tests.
sys.path.insert(0, str(Path(__file__).parent))

# The launcher forks ranks from this process. A forked child cannot use a thread pool its
# parent started (the pool's threads do not survive fork), so the pytest process must never
# start torch's intra-op pool: tests that compute in-process run single-threaded. Each forked
# rank then sizes its own pool (launch.py sets it from OMP_NUM_THREADS). What the ranks import
# (torch._dynamo among it) the launcher warms in this process before its first fork.
torch.set_num_threads(1)
