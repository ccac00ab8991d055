"""The ds_config's optimizer, gradient-communication and monitor keys, run on two forked gloo ranks.

    python scripts/show_ds_options.py optimizers   # Lamb's trust ratios at stage 0 and under ZeRO
    python scripts/show_ds_options.py comm         # what each gradient-communication key does to the mean
    python scripts/show_ds_options.py monitor      # csv_monitor's files and wall_clock_breakdown's lines
    python scripts/show_ds_options.py optimizers comm monitor --out DIR   # all three on the same
                                                   # ranks, each report written to DIR/<kind>.txt

Every rank builds the same small MLP, calls minitron.runtime.initialize() with the config shown and
trains on its half of each batch; rank 0 reports. Chapter 14 runs each at build time.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import tempfile
from pathlib import Path

WORLD = 2


def _mlp():
    import torch
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.Tanh(), torch.nn.Linear(10, 10), torch.nn.Tanh(),
                               torch.nn.Linear(10, 3))


def _train(engine, rank: int, steps: int) -> list:
    import torch
    losses = []
    for step in range(steps):
        g = torch.Generator().manual_seed(step)
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
        loss = torch.nn.functional.mse_loss(engine(x[2 * rank:2 * rank + 2]), y[2 * rank:2 * rank + 2])
        engine.backward(loss)
        engine.step()
        losses.append(round(loss.item(), 6))
    return losses


def optimizers(rank: int, out: Path) -> dict:
    from minitron.runtime import initialize
    report = {}
    for stage in (0, 1):
        config = {"train_batch_size": 4, "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True,
                  "optimizer": {"type": "Lamb", "params": {"lr": 0.01, "max_coeff": 0.3, "min_coeff": 0.01}}}
        engine, *_ = initialize(model=_mlp(), config=config)
        losses = _train(engine, rank, 3)
        report[stage] = {"losses": losses, "coeffs": [round(c, 4) for c in engine.basic_optimizer.get_lamb_coeffs()]}
    return report


COMM = {"fp32 (the default here)": {},
        "communication_data_type bf16": {"communication_data_type": "bf16"},
        "prescale_gradients": {"prescale_gradients": True},
        "gradient_predivide_factor 3": {"gradient_predivide_factor": 3.0}}


def comm(rank: int, out: Path) -> dict:
    import torch
    from minitron.runtime import initialize
    report = {}
    for name, keys in COMM.items():
        engine, *_ = initialize(model=_mlp(), config={"train_batch_size": 4, **keys,
                                                       "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(4, 6, generator=g), torch.randn(4, 3, generator=g)
        engine.backward(torch.nn.functional.mse_loss(engine(x[2 * rank:2 * rank + 2]), y[2 * rank:2 * rank + 2]))
        serial = _mlp()
        torch.nn.functional.mse_loss(serial(x), y).backward()   # the whole batch in one process
        want = torch.cat([p.grad.reshape(-1) for p in serial.parameters()])
        got = engine.optimizer.averaged_gradients[0][:want.numel()]
        report[name] = float((got - want).abs().max() / want.abs().max())
    return report


def monitor(rank: int, out: Path) -> dict:
    from minitron.runtime import initialize
    config = {"train_batch_size": 8, "gradient_accumulation_steps": 2, "wall_clock_breakdown": True,
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}},
              "csv_monitor": {"enabled": True, "output_path": str(out / "csv"), "job_name": "demo"}}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        engine, *_ = initialize(model=_mlp(), config=config)
        _train(engine, rank, 4)
    return {"printed": printed.getvalue()}


def show(kind: str, report: dict, out: Path) -> None:
    if kind == "optimizers":
        for stage in ("0", "1"):
            print(f"Lamb at ZeRO stage {stage}: losses {report[stage]['losses']}")
            print(f"  rank 0's trust ratios in the last step: {len(report[stage]['coeffs'])}")
            print(f"  {report[stage]['coeffs']}")
    elif kind == "comm":
        print("stage 0, two ranks: the reduced gradient against one process's,")
        print("max |difference| / max |gradient|")
        for name, diff in report.items():
            print(f"  {name:<30} {diff:.1e}")
    else:
        print(report["printed"].rstrip())
        for path in sorted((out / "csv" / "demo").iterdir()):
            rows = path.read_text().split()
            print(f"{path.name}: " + " ".join(rows[:1] + [f"{r.split(',')[0]},{float(r.split(',')[1]):.4g}"
                                                          for r in rows[1:]]))


KINDS = ("optimizers", "comm", "monitor")


def main(argv: list[str]) -> int:
    out = None
    if "--out" in argv[:-1]:   # chapter 14 shows all three: one launch of the ranks, not three
        at = argv.index("--out")
        out, argv = Path(argv[at + 1]), argv[:at] + argv[at + 2:]
    if not argv or any(kind not in KINDS for kind in argv) or (len(argv) > 1 and out is None):
        print("usage: show_ds_options.py KIND [KIND...] [--out DIR], KIND one of optimizers, comm, monitor; "
              "several kinds need --out DIR (each report goes to DIR/<kind>.txt)", file=sys.stderr)
        return 2
    kinds = list(dict.fromkeys(argv))
    import torch._dynamo  # noqa: F401  (torch.optim loads it on first use: once here, not per rank)

    from minitron.launcher import LaunchConfig, RankFailure, Target, launch

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)

        def rank_main():
            rank = int(os.environ["RANK"])
            report = {kind: globals()[kind](rank, tmp) for kind in kinds}
            (tmp / f"rank{rank}.json").write_text(json.dumps(report))

        try:
            launch(LaunchConfig(world_size=WORLD, log_dir=tmp / "logs"), Target(function=rank_main))
        except RankFailure as failure:
            print(f"{failure}\n{failure.log_tail()}", file=sys.stderr)
            return 1
        reports = json.loads((tmp / "rank0.json").read_text())
        for kind in kinds:
            if out is None:
                show(kind, reports[kind], tmp)
                continue
            printed = io.StringIO()
            with contextlib.redirect_stdout(printed):
                show(kind, reports[kind], tmp)
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{kind}.txt").write_text(printed.getvalue())
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main(sys.argv[1:]))
