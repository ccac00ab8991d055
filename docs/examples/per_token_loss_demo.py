"""The two loss normalisations, trained serially, on pp 2 x dp 2 and on cp 2. Chapter 10 runs this.

    python docs/examples/per_token_loss_demo.py

pretrain_gpt on forked gloo ranks (the launcher's API, as the tests run it): three iterations
of a small GPT on mock data with --eod-mask-loss, so that the micro-batches hold different
numbers of loss tokens, once with Megatron's default normalisation and once with
--calculate-per-token-loss. Each run's grad norm and lm loss per iteration come from its
iterations.jsonl.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

TRAIN = ["--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "3", "--lr", "1e-2",
         "--mock-data", "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0",
         "--seed", "7", "--distributed-backend", "gloo", "--eod-mask-loss"]
LAYOUTS = {"serial": (1, []), "pp 2 x dp 2": (4, ["--pipeline-model-parallel-size", "2"]),
           "cp 2": (2, ["--context-parallel-size", "2"])}
LOSSES = {"mean of means": [], "per token": ["--calculate-per-token-loss"]}


def main() -> None:
    from minitron.launcher import LaunchConfig, Target, launch

    print(f"{'loss normalisation':<18}  {'layout':<11}  {'grad norm, iterations 1-3':>34}  {'lm loss, iteration 3':>20}")
    with tempfile.TemporaryDirectory() as tmp:
        for loss, loss_flags in LOSSES.items():
            for layout, (world, flags) in LAYOUTS.items():
                out = Path(tmp) / f"{loss}-{layout}".replace(" ", "")
                argv = TRAIN + loss_flags + flags + ["--log-jsonl", str(out / "iterations.jsonl")]
                launch(LaunchConfig(world_size=world, log_dir=out / "logs"),
                       Target(module="minitron.pretrain_gpt", argv=argv))
                records = [json.loads(line) for line in (out / "iterations.jsonl").open()]
                norms = "  ".join(f"{r['grad_norm']:.6f}" for r in records)
                print(f"{loss:<18}  {layout:<11}  {norms:>34}  {records[-1]['lm_loss']:>20.6f}")


if __name__ == "__main__":
    main()
