"""`minitron pretrain`: train a GPT on many ranks (every rank runs pretrain_gpt with Megatron's flags)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

import typer

from minitron.cli.common import (
    DEBUG, DEBUG_HOST, DEBUG_PORT_BASE, DEBUG_WAIT, EXTRA, DebugOptions, UserError, app, rank_backend,
    check_world, console, validate_pretrain, HANG_TIMEOUT, check_hang_timeout, hang_screen,
)
from minitron.cli import preflight
from minitron.cli.preflight_memory import check_fits


@app.command(context_settings=EXTRA)
def pretrain(
    ctx: typer.Context,
    world: int = typer.Option(1, "--world", "-w", help="number of ranks"),
    backend: Optional[str] = typer.Option(None, "--backend", help="gloo (forked CPU ranks) or nccl (one GPU each)"),
    log_dir: Path = typer.Option(Path("minitron-logs"), "--log-dir", help="per-rank logs"),
    master_port: Optional[int] = typer.Option(None, "--master-port"),
    trace_dir: Optional[Path] = typer.Option(None, "--trace", help="record every rank's calls into this directory"),
    debug: Optional[str] = DEBUG, debug_port_base: int = DEBUG_PORT_BASE, debug_host: str = DEBUG_HOST,
    debug_wait_timeout: float = DEBUG_WAIT, hang_timeout: Optional[float] = HANG_TIMEOUT,
):
    """Train a GPT on WORLD ranks. Every other flag is Megatron's, passed to each rank
    (--tensor-model-parallel-size, --num-layers, --train-iters, --lr, --mock-data, ...)."""
    fake = "--backend fake moves no data, so it cannot train: use gloo or nccl"
    check_world(world)
    # The cheap checks first (microseconds each): the layout's checks grow with the world, and
    # nothing a user mistyped should wait for them, or for torch.
    preflight.check_world_limit(world, backend or "gloo")
    debugging = DebugOptions(debug, debug_port_base, debug_host, debug_wait_timeout)
    debugging.check(world)
    check_hang_timeout(hang_timeout, trace_dir is not None)
    argv = list(ctx.args)
    if backend is not None:  # given: check it now, and every rank uses it
        rank_backend(backend, world, fake)
        if "--distributed-backend" not in argv:
            argv += ["--distributed-backend", backend]
    if "--log-jsonl" not in argv:  # the progress display reads it, so there is always one
        argv += ["--log-jsonl", str((log_dir / "iterations.jsonl").resolve())]
    # Every refusal happens here, before torch is imported: validate_args asks the accelerator
    # for the default backend only once the flags have passed.
    args = validate_pretrain(argv, world)
    if not args.train_iters:
        raise UserError("--train-iters N or --train-samples N is required; `minitron trace` shows "
                        "initialization alone")
    # lazy, as validate_pretrain's import: the rules live with the training arguments
    from minitron.training.arguments_features import moe_training_refusal
    if moe_training_refusal(args):   # Megatron's MoE layer would raise at the first step
        raise UserError(moe_training_refusal(args))
    preflight.check_data_workers(args.num_workers, world)
    backend = rank_backend(args.distributed_backend, world, fake)  # None: default_backend's choice
    if args.distributed_backend is None:  # the ranks run what the launcher starts (fork: gloo)
        argv += ["--distributed-backend", backend]
    check_fits(args, backend)
    preflight.check_launch(world, backend, master_port,
                           {"--log-dir": log_dir, "--trace": trace_dir, "--save": args.save})
    preflight.check_output_file(args.log_jsonl, "--log-jsonl")

    # Lazy: the launcher and the run's console load once every check above has passed (`--help`
    # and a refusal never pay for them).
    from minitron.launcher import LaunchConfig, Target
    from minitron.launcher import launch as run
    from minitron.cli.progress import PretrainProgress
    from minitron.training.utils import CONSOLE_ENV
    log_jsonl = Path(args.log_jsonl)
    # The ranks append the lines Megatron prints for the console here; we show them as they come.
    console_jsonl = (log_dir / "console.jsonl").resolve()
    for path in (log_jsonl, console_jsonl):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.unlink(missing_ok=True)
    env = {CONSOLE_ENV: str(console_jsonl)}
    env.update(debugging.env(world, trace_dir))
    cfg = LaunchConfig(world_size=world, backend=backend, log_dir=log_dir, master_port=master_port, env=env,
                       hang_timeout=hang_timeout)
    started = time.perf_counter()
    with PretrainProgress(log_jsonl, console_jsonl, args.train_iters, console) as progress:
        # As Megatron's two entries: a hybrid pattern is pretrain_hybrid's model, the rest pretrain_gpt's.
        entry = "minitron.pretrain_hybrid" if args.hybrid_layer_pattern is not None else "minitron.pretrain_gpt"
        run(cfg, Target(module=entry, argv=argv), monitor=progress.poll,
            on_hang=hang_screen() if hang_timeout else None)
    for line in progress.summary(world, args.seq_length, time.perf_counter() - started, log_dir, log_jsonl):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
