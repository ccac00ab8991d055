"""How fast does the command line refuse bad input, against a bare `import torch`?

    python scripts/bench_cli.py [--runs 7]

Goal (issue #9.3): a refused layout, batch or flag answers in at most a quarter of the time of
`python -c "import torch"`. Each command runs the real `minitron` executable beside this
interpreter; the figure is the median wall time of several runs, and the ratio is that median
over the median of the torch import. Each refused command must exit 2 (checked), so a
command that stops refusing is not timed as fast.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

MINITRON = str(Path(sys.executable).parent / "minitron")
MODEL = ["--num-layers", "2", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
         "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-3", "--mock-data"]

CASES = {
    "pretrain: world 8, tp 3 (layout)":
        ["pretrain", "--world", "8", "--tensor-model-parallel-size", "3", "--backend", "gloo", *MODEL],
    "pretrain: global batch 7, dp 2 (batch)":
        ["pretrain", "--world", "2", "--global-batch-size", "7", "--backend", "gloo", *MODEL],
    "pretrain: --lr nan (flag)":
        ["pretrain", "--world", "2", "--backend", "gloo", *MODEL, "--lr", "nan"],
    "pretrain: world 8, tp 3, backend not given":
        ["pretrain", "--world", "8", "--tensor-model-parallel-size", "3", *MODEL],
    "trace: world 16, tp 3":
        ["trace", "--world", "16", "--tp", "3"],
}


def timed(cmd: list[str], expect: int) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True)
    elapsed = time.perf_counter() - start
    if proc.returncode != expect:
        raise SystemExit(f"{' '.join(cmd)}: exit {proc.returncode}, expected {expect}\n{proc.stderr}")
    return elapsed


def median_of(cmd: list[str], runs: int, expect: int) -> float:
    timed(cmd, expect)  # one warm-up run: file-system caches, .pyc files
    return statistics.median(timed(cmd, expect) for _ in range(runs))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=7)
    runs = parser.parse_args().runs
    torch_s = median_of([sys.executable, "-c", "import torch"], runs, 0)
    print(f"python -c 'import torch': median {torch_s:.3f} s over {runs} runs")
    for name, argv in CASES.items():
        seconds = median_of([MINITRON, *argv], runs, 2)
        ratio = seconds / torch_s
        print(f"{name:45s} {seconds:6.3f} s   {ratio:5.2f} x import torch   "
              f"{'ok' if ratio <= 0.25 else 'OVER the 0.25 goal'}")


if __name__ == "__main__":
    main()
