"""Megatron-FSDP's four sharding strategies side by side: chapter 12 runs this.

    python docs/examples/fsdp_strategies.py

For each --data-parallel-sharding-strategy, one traced `pretrain` on 2 forked gloo ranks (a
4-layer GPT of hidden size 64, 2 micro-batches per rank, 2 iterations). Per strategy, one row:
rank 0's bytes as `minitron estimate` predicts them (tests/test_fsdp_estimate.py checks that
prediction against what a run holds), the collectives rank 0 called over the data-parallel
group in the last traced iteration, and the last loss, which every strategy must share.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

from minitron.cli.common import validate_pretrain
from minitron.cli.views.diff import inside
from minitron.core.distributed.fsdp import STRATEGIES
from minitron.launcher import LaunchConfig, Target, launch, session_env
from minitron.trace.reader import TRAIN_STEP, load_trace
from minitron.training import theoretical_memory_usage as tmu
from minitron.training.tokenizer import build_tokenizer

OUT = Path("docs-out/fsdp")
MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "2", "--lr", "1e-3",
         "--mock-data", "--vocab-size", "1023", "--distributed-backend", "gloo", "--use-megatron-fsdp"]
# What pretrain's ranks import only once they train (the optimizer, Megatron-FSDP, the data
# path): imported here once, not in each of the 8 ranks this page starts.
WARM = ("torch._dynamo", "minitron.core.optimizer", "minitron.core.distributed.finalize_model_grads",
        "minitron.core.distributed.fsdp.fully_sharded_data_parallel", "minitron.training.data")
SHORT = {"all_gather_into_tensor": "AG", "reduce_scatter_tensor": "RS", "all_reduce": "AR"}


def run(strategy: str) -> tuple[float, Counter]:
    """Train on 2 ranks; (the last loss, rank 0's data-parallel collectives in the last step)."""
    out = OUT / strategy
    argv = [*MODEL, "--data-parallel-sharding-strategy", strategy, "--log-jsonl", str(out / "it.jsonl")]
    out.mkdir(parents=True, exist_ok=True)
    (out / "it.jsonl").unlink(missing_ok=True)
    launch(LaunchConfig(world_size=2, log_dir=out / "logs", env=session_env(2, out / "trace"), warm=WARM),
           Target(module="minitron.pretrain_gpt", argv=argv))
    loss = [json.loads(line) for line in open(out / "it.jsonl")][-1]["lm_loss"]
    records = load_trace(out / "trace")[0]
    last = [r for r in records if r["name"] == TRAIN_STEP][-1]
    calls = Counter()
    for r in inside(records, TRAIN_STEP):
        if last["start_us"] <= r["start_us"] <= last["end_us"] and r["args"].get("group") == "DATA_PARALLEL_GROUP_WITH_CP":
            calls[SHORT.get(r["name"].rsplit(".", 1)[-1], r["name"])] += 1
    return loss, calls


def main() -> None:
    print(f"{'strategy':<19} {'weights':>8} {'grads':>8} {'optim.':>8}  {'dp collectives, one step':<26} {'loss':>8}")
    for strategy in STRATEGIES:
        args = validate_pretrain([*MODEL, "--data-parallel-sharding-strategy", strategy], 2)
        build_tokenizer(args)
        memory = tmu.report_theoretical_memory(args)[0].memory
        loss, calls = run(strategy)
        kib = [f"{memory[k] / 1024:.0f} KiB" for k in ("params", "grads", "optimizer")]
        said = ", ".join(f"{n} {kind}" for kind, n in sorted(calls.items()))
        print(f"{strategy:<19} {kib[0]:>8} {kib[1]:>8} {kib[2]:>8}  {said:<26} {loss:>8.5f}")
    print("AG all-gather, RS reduce-scatter, AR all-reduce (one AR of 8 bytes is the step's loss)")


if __name__ == "__main__":
    sys.exit(main())
