"""One harness for tests and scripts: run a Python function on every rank, get its results back.

    results = run_on_ranks(body, LaunchConfig(world_size=4))   # body(rank) on 4 forked gloo ranks
    assert results[1] == ...

Each rank joins the world (``init_process_group``, env://, as the launcher's variables say)
before ``body`` runs and leaves it afterwards, so a body only builds what it studies: Megatron's
groups, a layer, an optimizer. What it returns is pickled into a scratch directory and read back
in rank order. A rank that raises fails the call with RankFailure, which keeps the last lines of
that rank's log (the scratch directory, logs included, is gone by the time the caller looks).
"""

from __future__ import annotations

import os
import pickle
import tempfile
from dataclasses import replace
from pathlib import Path
from typing import Callable, TypeVar

from minitron.launcher.failures import RankFailure
from minitron.launcher.launch import LaunchConfig, launch
from minitron.launcher.worker import Target

T = TypeVar("T")


def run_on_ranks(body: Callable[[int], T], cfg: LaunchConfig) -> list[T]:
    """``body(rank)`` on ``cfg.world_size`` forked ranks, each inside the world; their results."""
    with tempfile.TemporaryDirectory(prefix="minitron-ranks-") as scratch:
        scratch = Path(scratch)

        def rank_main() -> int:
            # Imported here, in the forked rank, where it costs nothing (the launcher's parent
            # has loaded torch by now): this module is imported by code that must stay torch-free.
            import torch.distributed

            rank = int(os.environ["RANK"])
            torch.distributed.init_process_group(cfg.backend)
            try:
                result = body(rank)
            finally:
                torch.distributed.destroy_process_group()
            (scratch / f"rank{rank}.pkl").write_bytes(pickle.dumps(result))
            return 0

        if cfg.log_dir is None:
            cfg = replace(cfg, log_dir=scratch / "logs")
        try:
            launch(cfg, Target(function=rank_main))
        except RankFailure as failure:
            failure.keep_log_tail()
            raise
        return [pickle.loads((scratch / f"rank{r}.pkl").read_bytes()) for r in range(cfg.world_size)]
