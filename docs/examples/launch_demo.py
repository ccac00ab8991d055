"""What a rank is told, seen from inside the rank. The walkthrough's chapter 1 runs this.

    python docs/examples/launch_demo.py env 4     # minitron's launcher: 4 forked ranks
    python docs/examples/launch_demo.py env 4 29500   # ... serving the rendezvous on port 29500
    python docs/examples/launch_demo.py fail 4    # rank 2 exits with code 3; the rest are stopped
    torchrun --master-port 29500 --nproc-per-node 2 docs/examples/launch_demo.py show
    minitron launch --include localhost:0,1 docs/examples/launch_demo.py deepspeed --x 1

The same `show` runs under both launchers: a program that reads only these variables cannot
tell who started it, which is the whole point of the contract.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def show() -> int:
    print(" ".join(f"{name}={os.environ.get(name, '(unset)')}" for name in CONTRACT))
    return 0


# What DeepSpeed's launch.py sets for each rank, beyond the contract, and the argument it adds.
DEEPSPEED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_SIZE", "CROSS_RANK", "CROSS_SIZE")


def show_deepspeed() -> int:
    rank = os.environ.get("RANK", "?")
    print(f"rank {rank}  env: " + " ".join(f"{name}={os.environ.get(name, '(unset)')}" for name in DEEPSPEED))
    print(f"rank {rank} argv: " + " ".join(sys.argv[1:]))
    return 0


def under_minitron(world: int, port: int | None = None) -> None:
    from minitron.launcher import LaunchConfig, Target, launch

    with tempfile.TemporaryDirectory() as tmp:
        # Each rank writes to its own log; reading them back in rank order keeps the page stable,
        # and so does a port given (None: the launcher picks a free one, new on every run).
        launch(LaunchConfig(world_size=world, log_dir=Path(tmp), master_port=port), Target(function=show))
        for rank in range(world):
            print(f"rank{rank}.log: " + (Path(tmp) / f"rank{rank}.log").read_text().strip())


def one_rank_fails(world: int, bad: int = 2) -> None:
    from minitron.launcher import LaunchConfig, RankFailure, Target, launch

    def body() -> int:
        if int(os.environ["RANK"]) == bad:
            sys.exit(3)      # a crash, a failed assert, an OOM kill: any non-zero exit
        time.sleep(60)       # the others "wait in a collective" for a peer that is gone
        return 0

    import torch.distributed  # noqa: F401  (the launcher imports it anyway; do it before the clock starts)

    started = time.monotonic()
    try:
        launch(LaunchConfig(world_size=world), Target(function=body))
    except RankFailure as failure:
        waited = time.monotonic() - started
        print(f"RankFailure: {failure}")
        print(f"the other {world - 1} ranks were stopped; launch returned after {waited:.1f} s, "
              f"not after their 60 s sleep")
    else:
        raise SystemExit("expected rank failure did not happen")


if __name__ == "__main__":
    # DeepSpeed's launch.py puts --local_rank=N before the program's own arguments.
    mode, *rest = [a for a in sys.argv[1:] if not a.startswith("--local_rank=")] or ["show"]
    if mode == "show":
        show()
    elif mode == "deepspeed":
        show_deepspeed()
    elif mode == "env":
        under_minitron(int(rest[0]) if rest else 4, int(rest[1]) if len(rest) > 1 else None)
    elif mode == "fail":
        one_rank_fails(int(rest[0]) if rest else 4)
    else:
        raise SystemExit(f"unknown mode {mode!r}: use show, env or fail")
