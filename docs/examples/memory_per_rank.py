"""Bytes per rank of a real mixed-precision run: parameters, gradients, fp32 main params, Adam.

    python docs/examples/memory_per_rank.py OUT_DIR [Megatron flags...]

runs `minitron pretrain` with the flags given (at least one iteration, so that Adam's state
exists) and, on every rank, measures what its model and optimizer hold once training is done:

* parameters: the model's own tensors, in their training dtype (bf16 with --bf16);
* gradients: DDP's ``main_grad`` buffers: fp32 with --bf16 (Megatron's default) or
  --accumulate-allreduce-grads-in-fp32, else the parameters' dtype;
* fp32 main params: the optimizer's fp32 copies of 16-bit parameters (a shard of them with
  --use-distributed-optimizer); an fp32 model's own parameters, which the optimizer steps in
  place, are not counted twice;
* Adam moments: ``exp_avg`` and ``exp_avg_sq``, fp32, one pair per main param (sharded too).

It prints a table and writes OUT_DIR/memory.svg, one bar per rank (svg_curves.bars_svg);
what `minitron pretrain` printed goes to OUT_DIR/pretrain.txt.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from pathlib import Path

PARTS = ("parameters", "gradients", "fp32 main params", "Adam moments")


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def measure(model, optimizer) -> dict:
    """What this rank holds, by kind (see the module docstring)."""
    import torch

    from minitron.core import parallel_state as mpu

    chunks = model if isinstance(model, list) else [model]
    params = [p for chunk in chunks for p in chunk.parameters()]
    held = {p.untyped_storage().data_ptr() for p in params}  # a view of a parameter is no new memory
    inner = optimizer.optimizer  # the torch optimizer Megatron's wraps
    stepped = [p for group in inner.param_groups for p in group["params"]]
    states = [v for p in stepped for v in inner.state.get(p, {}).values()
              if torch.is_tensor(v) and v.numel() > 1]  # Adam's step counter is not memory
    return {"parameters": _bytes(params),
            "gradients": _bytes(p.main_grad for p in params if getattr(p, "main_grad", None) is not None),
            "fp32 main params": _bytes(p for p in stepped if p.untyped_storage().data_ptr() not in held),
            "Adam moments": _bytes(states),
            "numel": sum(p.numel() for p in params), "dtype": str(params[0].dtype).replace("torch.", ""),
            "where": f"pp{mpu.get_pipeline_model_parallel_rank()} dp{mpu.get_data_parallel_rank()} "
                     f"tp{mpu.get_tensor_model_parallel_rank()}"}


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__.split("\n\n")[1])
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob("memory-rank*.json"):
        stale.unlink()

    from minitron.cli import main as minitron_main
    from minitron.training import training

    real_train = training.train

    def train_and_measure(forward_step_func, model, optimizer, *args, **kwargs):
        result = real_train(forward_step_func, model, optimizer, *args, **kwargs)
        (out / f"memory-rank{os.environ['RANK']}.json").write_text(json.dumps(measure(model, optimizer)))
        return result

    training.train = train_and_measure  # the ranks are forked from here and inherit it
    flags = sys.argv[2:]
    sys.argv = ["minitron", "pretrain", *flags, "--log-dir", str(out / "logs")]
    with open(out / "pretrain.txt", "w") as log, contextlib.redirect_stdout(log):
        try:
            minitron_main()
        except SystemExit as exc:
            if exc.code:
                print(f"minitron pretrain failed (exit code {exc.code}): see {out / 'pretrain.txt'}", file=sys.stderr)
                raise
    print(f"minitron pretrain {' '.join(flags)}")
    report(out)


def report(out: Path) -> None:
    from minitron.cli.views.svg_curves import bars_svg

    ranks = sorted(out.glob("memory-rank*.json"), key=lambda p: int(p.stem.removeprefix("memory-rank")))
    rows = {f"rank {int(p.stem.removeprefix('memory-rank'))}": json.loads(p.read_text()) for p in ranks}
    print()
    print(f"{'':<7}{'':>10}" + "".join(f"{part.split()[0]:>13}" for part in PARTS) + f"{'bytes a':>9}")
    print(f"{'rank':<7}{'place':>10}" + "".join(f"{' '.join(part.split()[1:]) or 'bytes':>13}" for part in PARTS)
          + f"{'param':>9}")
    for name, row in rows.items():
        total = sum(row[part] for part in PARTS)
        print(f"{name.split()[1]:<7}{row['where']:>10}" + "".join(f"{row[part]:>13,}" for part in PARTS)
              + f"{total / row['numel']:>9.1f}")
    dtype = next(iter(rows.values()))["dtype"]
    (out / "memory.svg").write_text(bars_svg({f"{n} {r['where'].split(' tp')[0]}": {part: r[part] for part in PARTS}
                                              for n, r in rows.items()},
                                             heading=f"bytes per rank after training ({dtype} parameters)"))


if __name__ == "__main__":
    main()
