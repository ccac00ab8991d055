"""One GPT, every way to shard it over 8 data-parallel ranks: bytes per rank and collectives per
iteration, measured from real runs (chapter 12b).

    python scripts/compare_sharding.py run              # ~10 traced 8-rank runs; writes the JSON
    python scripts/compare_sharding.py run --only DDP ZeRO-1 --out /tmp/x.json
    python scripts/compare_sharding.py show             # the tables, from the committed JSON
    python scripts/compare_sharding.py svg FILE         # the chapter's figure, from it

Each configuration is one `pretrain` of the same model (MODEL) on forked gloo ranks, traced.
Every rank measures what its model and optimizer hold (scripts/compare_sharding_measure.py):
at the entry of the last optimizer step (parameters, gradients and optimizer state all exist
then), at the highest sampled moment (after every parameter all-gather, and at the step), and
after training. Rank 0's trace gives the collectives of the last iteration, by kind and group.
Every configuration's losses must equal one serial process's within LOSS_TOL, and its bytes
must equal what `minitron estimate` predicts for the same flags: the script stops otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))   # its sibling modules, from any cwd

ROOT = Path(__file__).resolve().parents[1]
JSON = ROOT / "docs/sharding-runs/compare.json"
WORLD, ITERS = 8, 2
# Dropout off and one seed: every configuration then computes the same sums in another order,
# so the losses differ by fp32 rounding alone. Embedding and output weights untied: FSDP2 refuses
# a tied pair (Megatron's rule), and every row must train the same model.
MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
         "--micro-batch-size", "1", "--global-batch-size", "16", "--lr", "1e-3", "--mock-data",
         "--vocab-size", "1023", "--hidden-dropout", "0", "--attention-dropout", "0", "--seed", "7",
         "--untie-embeddings-and-output-weights", "--distributed-backend", "gloo"]
# Summing 16 micro-batches' gradients over 8 ranks in another order moves the fp32 loss by
# ~1e-6 after two Adam steps; a sharding bug (a lost or doubled gradient) moves it by >1e-3.
LOSS_TOL = 1e-5
# DeepSpeed's side: the triad as Megatron's flags give it, the clipping Megatron's --clip-grad
# defaults to, and a reduce_bucket_size that cuts the 268k gradients into a few buckets (the
# default, 5e8 elements, would make one) so that ZeRO-2's bucketing is seen in the trace.
DS_CONFIG = {"train_batch_size": 16, "train_micro_batch_size_per_gpu": 1, "gradient_clipping": 1.0}
BUCKET = 100_000
CONFIGS = {   # name: (Megatron flags, ZeRO stage under --deepspeed or None)
    "DDP": ([], None),
    "distributed optimizer": (["--use-distributed-optimizer"], None),
    **{f"FSDP {s}": (["--use-megatron-fsdp", "--data-parallel-sharding-strategy", s], None)
       for s in ("no_shard", "optim", "optim_grads", "optim_grads_params")},
    **{f"ZeRO-{stage}": ([], stage) for stage in (1, 2, 3)},
    # torch's fully_shard; Megatron requires the flag beside it (its fused accumulation writes
    # into DDP's main_grad, which FSDP2's gradients do not have). On CPU it changes nothing else.
    "FSDP2": (["--use-torch-fsdp2", "--no-gradient-accumulation-fusion"], None),
}


def argv_of(name: str, tmp: Path, iters: int) -> list[str]:
    """The pretrain flags of one configuration (its ds_config written under ``tmp``)."""
    flags, stage = CONFIGS[name]
    argv = [*MODEL, "--train-iters", str(iters), *flags]
    if stage is not None:
        path = tmp / f"zero{stage}.json"
        path.write_text(json.dumps(ds_config(stage)))
        argv += ["--deepspeed", "--deepspeed-config", str(path)]
    return argv


def ds_config(stage: int) -> dict:
    return {**DS_CONFIG, "zero_optimization": {"stage": stage, "reduce_bucket_size": BUCKET}}


def estimate(argv: list[str], world: int) -> dict:
    """Rank 0's prediction from `minitron estimate`'s code: bytes and calls per group kind."""
    from minitron.cli.common import validate_pretrain
    from minitron.training import theoretical_memory_usage as tmu
    from minitron.training.tokenizer import build_tokenizer

    args = validate_pretrain(argv, world)
    build_tokenizer(args)
    cost = tmu.report_theoretical_memory(args)[0]
    return {"memory": {k: cost.memory[k] for k in ("params", "grads", "optimizer")},
            "comm": dict(cost.comm), "calls": dict(cost.calls)}


def run_one(name: str, tmp: Path, world: int, iters: int) -> dict:
    """Train one configuration on ``world`` ranks; its row of the JSON."""
    from compare_sharding_measure import collectives, launch_measured

    argv = argv_of(name, tmp, iters)
    out = tmp / name.replace(" ", "_")
    ranks, losses = launch_measured(argv, world, out)
    calls = collectives(out / "trace", world)
    row = {"name": name, "flags": CONFIGS[name][0], "losses": losses, "ranks": ranks, **calls,
           "estimate": estimate(argv, world)}
    if CONFIGS[name][1] is not None:
        row["ds_config"] = ds_config(CONFIGS[name][1])
    return row


def environment() -> dict:
    import torch

    def git(*a):
        return subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True).stdout.rstrip("\n")
    return {"utc": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M"), "commit": git("rev-parse", "--short", "HEAD"),
            # what the ranks ran that the commit does not hold (tracked files changed since)
            "uncommitted": sorted(line[3:] for line in git("status", "--porcelain", "--untracked-files=no", "--",
                                                           "minitron", "scripts/compare_sharding*.py").splitlines()),
            "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
            "cpus": os.cpu_count(), "backend": "gloo, forked CPU ranks"}


def run(names: list[str], world: int, iters: int, serial: bool = True) -> dict:
    from compare_sharding_measure import launch_measured

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = []
        for name in names:
            print(f"{name} ...", file=sys.stderr, flush=True)
            rows.append(run_one(name, tmp, world, iters))
        serial_losses = launch_measured([*MODEL, "--train-iters", str(iters)], 1, tmp / "serial")[1] if serial else None
    report = {"produced": environment(), "world": world, "iters": iters, "model": MODEL,
              "loss_tolerance": LOSS_TOL, "serial_losses": serial_losses, "configs": rows}
    return report


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    r = sub.add_parser("run", help="train every configuration, check, write the JSON")
    r.add_argument("--only", nargs="+", choices=list(CONFIGS), help="these configurations only")
    r.add_argument("--world", type=int, default=WORLD, help="ranks (= data-parallel size), 2-8")
    r.add_argument("--iters", type=int, default=ITERS, help="iterations, 1-4")
    r.add_argument("--out", type=Path, default=JSON, help=f"where the JSON goes (default {JSON.relative_to(ROOT)})")
    r.add_argument("--no-serial", action="store_true", help="skip the one-rank run the losses are held against")
    s = sub.add_parser("show", help="print the tables of a JSON")
    s.add_argument("json", nargs="?", type=Path, default=JSON)
    g = sub.add_parser("svg", help="write the figure of a JSON")
    g.add_argument("file", type=Path)
    g.add_argument("--json", type=Path, default=JSON)
    args = parser.parse_args(argv)

    from compare_sharding_view import check, figure, tables

    if args.command == "run":
        if not 2 <= args.world <= 8 or 16 % args.world:
            parser.error(f"--world must divide the global batch of 16 and be 2-8, got {args.world}")
        if not 1 <= args.iters <= 4:
            parser.error(f"--iters must be 1-4, got {args.iters}")
        report = run(args.only or list(CONFIGS), args.world, args.iters, serial=not args.no_serial)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=1) + "\n")   # kept when a check fails, to be read
        print("\n".join(tables(report)))
        problems = check(report)
        for line in problems:
            print(f"compare_sharding: {line}", file=sys.stderr)
        return 1 if problems else 0
    path = args.json
    if not path.is_file():
        parser.error(f"no such file: {path} (write one with `python scripts/compare_sharding.py run`)")
    report = json.loads(path.read_text())
    if args.command == "show":
        print("\n".join(tables(report)))
    else:
        args.file.write_text(figure(report))
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    sys.exit(main())
