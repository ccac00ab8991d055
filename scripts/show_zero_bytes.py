"""Bytes each data-parallel rank holds at ZeRO stages 0-3, measured on forked gloo ranks.

    python scripts/show_zero_bytes.py             # dp=4
    python scripts/show_zero_bytes.py --dp 2

Every rank builds the same MLP, calls minitron.runtime.initialize() with Adam and two
micro-batches per step, trains two steps, and reports what its engine holds: parameters and
optimizer states (fp32 master + Adam's two moments) after the steps, gradients between the two
micro-batches (what accumulation keeps), and the losses, which a second table sets beside one
process's run on the whole batch. Columns show bytes and the fraction of the model's own (4 bytes a
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


MICRO, GAS, STEPS, LR = 2, 2, 2, 1e-3


def _batch(step: int, dp: int):
    """The whole step's batch (micro x accumulation x dp samples), the same in every process."""
    import torch
    g = torch.Generator().manual_seed(step)
    x = torch.randn(MICRO * GAS * dp, IN, generator=g)
    return x, torch.sin(x)


def rank_main(dp: int, out_dir: Path) -> int:
    import torch
    import torch.distributed as dist

    from minitron.runtime import initialize

    dist.init_process_group("gloo")
    try:
        rank, report = dist.get_rank(), {}
        for stage in (0, 1, 2, 3):
            config = {"train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": GAS,
                      "optimizer": {"type": "Adam", "params": {"lr": LR}},
                      "zero_optimization": {"stage": stage}}
            engine, *_ = initialize(model=_mlp(), config=config)
            losses, grads = [], None
            for step in range(STEPS):
                x, y = _batch(step, dp)
                total = torch.zeros(1)
                for k in range(GAS):   # micro-batch k of rank r: rows (k * dp + r) * MICRO onwards
                    rows = slice((k * dp + rank) * MICRO, (k * dp + rank + 1) * MICRO)
                    total += engine.backward(torch.nn.functional.mse_loss(engine(x[rows]), y[rows])).detach()
                    if grads is None:
                        grads = engine.bytes_held()["grads"]   # between micro-batches
                    engine.step()
                dist.all_reduce(total)
                losses.append(total.item() / dp)
            report[stage] = {**engine.bytes_held(), "grads": grads, "losses": losses}
        report["numel"] = sum(p.numel() for p in _mlp().parameters())
        (out_dir / f"rank{rank}.json").write_text(json.dumps(report))
    finally:
        dist.destroy_process_group()
    return 0


def serial_losses(dp: int) -> list:
    """One process, the whole batch at once, torch's AdamW (DeepSpeed's "Adam")."""
    import torch
    model = _mlp()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS):
        x, y = _batch(step, dp)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses


def loss_table(reports: list, serial: list) -> list[str]:
    lines = ["Loss of each step (mean over the ranks' micro-batches) and one process on the whole",
             "batch:", "", f"{'step':<6}{'serial':>11}" + "".join(f"{'stage ' + s:>11}" for s in "0123")
             + f"{'largest |diff|':>17}"]
    for step, want in enumerate(serial):
        got = [reports[0][s]["losses"][step] for s in "0123"]
        diff = max(abs(g - want) for g in got)
        lines.append(f"{step + 1:<6}{want:>11.7f}" + "".join(f"{g:>11.7f}" for g in got) + f"{diff:>17.1e}")
    return lines


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
        row = {k: first[stage][k] for k in ("params", "grads", "optimizer_states")}
        cells = [f"{row[k]:>10,} {row[k] / base[k]:6.4f}" for k in ("params", "grads", "optimizer_states")]
        total = sum(row[k] for k in ("params", "grads", "optimizer_states"))
        lines.append(f"{stage:<7}{cells[0]:>18}{cells[1]:>18}{cells[2]:>22}{total:>10,}")
    differ = [r for r, rep in enumerate(reports) if any(
        rep[s][k] != first[s][k] for s in "0123" for k in ("params", "grads", "optimizer_states"))]
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
    print()
    print("\n".join(loss_table(reports, serial_losses(args.dp))))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
