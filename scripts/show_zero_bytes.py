"""Bytes each data-parallel rank holds at ZeRO stages 0-3, measured on forked gloo ranks.

    python scripts/show_zero_bytes.py             # dp=4
    python scripts/show_zero_bytes.py --dp 2

Every rank builds the same MLP, calls minitron.runtime.initialize() with Adam and two
micro-batches per step, and reports what its engine holds: parameters and optimizer states
(fp32 master + Adam's two moments) after a full step, gradients between the two micro-batches
(what accumulation keeps). Columns show bytes and the fraction of the model's own (4 bytes a
parameter; 12 for the optimizer states); stage 1 cuts the optimizer states, stage 2 also the gradients, stage 3 also the
parameters, each to 1/dp up to the padding that makes the partitions equal.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

IN, HIDDEN = 15, 50   # odd sizes, so that the padding shows


def _mlp():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(IN, HIDDEN), torch.nn.LayerNorm(HIDDEN), torch.nn.GELU(),
                               torch.nn.Linear(HIDDEN, HIDDEN), torch.nn.GELU(), torch.nn.Linear(HIDDEN, IN))


def rank_main(dp: int, out_dir: Path) -> int:
    import torch
    import torch.distributed as dist

    from minitron.runtime import initialize

    dist.init_process_group("gloo")
    try:
        rank, report = dist.get_rank(), {}
        for stage in (0, 1, 2, 3):
            config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
                      "optimizer": {"type": "Adam", "params": {"lr": 1e-3}},
                      "zero_optimization": {"stage": stage}}
            engine, *_ = initialize(model=_mlp(), config=config)
            x = torch.randn(4, IN, generator=torch.Generator().manual_seed(rank))
            grads = None
            for k in range(2):
                engine.backward(engine(x[2 * k:2 * k + 2]).pow(2).mean())
                if k == 0:
                    grads = engine.bytes_held()["grads"]
                engine.step()
            report[stage] = {**engine.bytes_held(), "grads": grads}
        report["numel"] = sum(p.numel() for p in _mlp().parameters())
        (out_dir / f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()
    return 0


def table(reports: list, dp: int) -> list[str]:
    first = reports[0]
    numel = first["numel"]
    lines = [f"ZeRO over {dp} data-parallel ranks: an MLP of {numel:,} fp32 parameters "
             f"({4 * numel:,} bytes),",
             "Adam, 2 micro-batches a step. Bytes held by rank 0, and their fraction of the model's:",
             "",
             f"{'stage':<7}{'parameters':>18}{'gradients':>18}{'optimizer states':>22}{'total':>10}"]
    base = {"params": 4 * numel, "grads": 4 * numel, "optimizer_states": 12 * numel}
    for stage in ("0", "1", "2", "3"):
        row = first[stage]
        cells = [f"{row[k]:>10,} {row[k] / base[k]:6.4f}" for k in ("params", "grads", "optimizer_states")]
        total = sum(row[k] for k in ("params", "grads", "optimizer_states"))
        lines.append(f"{stage:<7}{cells[0]:>18}{cells[1]:>18}{cells[2]:>22}{total:>10,}")
    differ = [r for r, rep in enumerate(reports) if rep != first]
    lines.append("")
    lines.append("every rank holds the same" if not differ else f"ranks {differ} hold other amounts (padding)")
    lines.append(f"1/dp = {1 / dp:.4f}; above it is padding, which makes the partitions equal: stages")
    lines.append("0-2 pad the flat buffer to a multiple of 2 x dp elements, stage 3 pads each parameter")
    lines.append("to a multiple of dp")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dp", type=int, default=4, help="data-parallel size (= number of ranks), 1-8")
    args = parser.parse_args(argv)
    if not 1 <= args.dp <= 8:
        parser.error(f"--dp must be between 1 and 8, got {args.dp}")

    import torch._dynamo  # noqa: F401  (torch.optim loads it on first use: once here, not per rank)

    from minitron.launcher import LaunchConfig, RankFailure, Target, launch

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        config = LaunchConfig(world_size=args.dp, log_dir=tmp / "logs")
        try:
            launch(config, Target(function=lambda: rank_main(args.dp, tmp)))
        except RankFailure as failure:
            print(f"{failure}\n{failure.log_tail()}", file=sys.stderr)
            return 1
        reports = [json.loads((tmp / f"rank{r}.json").read_text()) for r in range(args.dp)]
    print("\n".join(table(reports, args.dp)))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
