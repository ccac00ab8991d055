"""How fast are issue #25's refusals, as a ratio to a bare `import torch`?

    python scripts/bench_refusals.py [--runs 5]

The rule: a refusal that needs no torch answers in at most 0.25x an `import torch`, i.e. the
command validates first and imports later. Each case here was slow (torch imported before the
check), accepted, or a traceback before issue #25; it runs as a user runs it, through the real
`minitron` executable, and must exit 2. Printed: each case's median wall time over the runs,
and that median over the median of `python -c "import torch"`. No assertion: the machine is
shared and noisy, so the figures are for reading (tests/test_bad_inputs_flags.py checks the
cause instead: torch not imported).
"""

from __future__ import annotations

import argparse
import os
import sys

from bench_cli import MINITRON, median_of   # scripts/ is this script's directory, so on its path

TRAIN = ("--num-layers 2 --hidden-size 16 --num-attention-heads 2 --seq-length 16 --micro-batch-size 1 "
         "--train-iters 2 --lr 1e-3").split()
MOCK = [*TRAIN, "--mock-data"]

CASES = {
    "trace --debug 9 (world 4)": ["trace", "--world", "4", "--debug", "9"],
    "trace --debug-port-base 70000": ["trace", "--world", "4", "--debug-port-base", "70000"],
    "trace --debug-wait-timeout nan": ["trace", "--world", "4", "--debug-wait-timeout", "nan"],
    "trace --debug-host ''": ["trace", "--world", "4", "--debug-host", ""],
    "trace --pp 2 --vp 0": ["trace", "--world", "2", "--pp", "2", "--vp", "0"],
    "trace --world 1000000000": ["trace", "--world", "1000000000"],
    "trace --world 1e20": ["trace", "--world", "1e20"],
    "pretrain --data-path missing_prefix": ["pretrain", *TRAIN, "--data-path", "missing_prefix"],
    "pretrain --data-path inf pfx": ["pretrain", *TRAIN, "--data-path", "inf", "pfx"],
    "pretrain --backend nccl, no GPU": ["pretrain", "--backend", "nccl", *MOCK],
    "pretrain --hidden-size 1000000 (memory)": ["pretrain", *MOCK, "--hidden-size", "1000000"],
    "pretrain --train-iters 2**31 (index)": ["pretrain", *MOCK, "--train-iters", "2000000000",
                                             "--global-batch-size", "1024"],
    "pretrain --num-workers 100000": ["pretrain", *MOCK, "--num-workers", "100000"],
    "pretrain --initial-loss-scale 1e30": ["pretrain", *MOCK, "--initial-loss-scale", "1e30"],
    "estimate MoE, tp 2, no SP": ["estimate", "--world", "4", *TRAIN[:10], "--tp", "2", "--ep", "2",
                                  "--num-experts", "4"],
    "estimate --moe-router-topk 2, dense": ["estimate", "--world", "1", *TRAIN[:10], "--moe-router-topk", "2"],
    "estimate --num-layers 1000000000": ["estimate", "--world", "1", *TRAIN[2:10], "--num-layers", "1000000000"],
    "groups --world 8 --tp 1e20": ["groups", "--world", "8", "--tp", "1e20"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5)
    runs = parser.parse_args().runs
    # A GPU machine would accept nccl: hide the GPUs (from every run, `import torch` included:
    # importing does not touch them), so that case is a refusal everywhere.
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
    torch_s = median_of([sys.executable, "-c", "import torch"], runs, 0)
    print(f"python -c 'import torch': median {torch_s:.3f} s over {runs} runs")
    width = max(map(len, CASES))
    for name, argv in CASES.items():
        seconds = median_of([MINITRON, *argv], runs, 2)
        print(f"  {name:<{width}}  {seconds:6.3f} s  {seconds / torch_s:5.2f}x import torch")


if __name__ == "__main__":
    main()
