"""`minitron trace`: run the real initialization (and, with --steps, training iterations) on
every rank, then show one rank's call tree, the groups, the checks and the pipeline schedule."""

from __future__ import annotations

import time
from pathlib import Path
from typing import List, Optional

import typer

from minitron.cli.common import (
    DEBUG, DEBUG_HOST, DEBUG_PORT_BASE, DEBUG_WAIT, EXTRA, ORDERS, DebugOptions, UserError, app, check_backend,
    check_order, check_world, console, default_backend, validate_pretrain,
)
from minitron.cli import preflight
from minitron.core.rank_generator import DEFAULT_ORDER, TP_PP_DP_ORDER

# --8<-- [start:pretrain-argv]
def pretrain_argv(tp: int, pp: int, cp: int, ep: int, vp: Optional[int], order: str, backend: str,
                  extra: List[str]) -> List[str]:
    """Megatron flags for a tiny GPT in this layout; the user's own flags (``extra``) come last
    and win. The defaults always satisfy validate_args: layers divide by pp x vp, heads by tp."""
    layers = pp * (vp or 1)
    heads = 2 * tp
    argv = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--context-parallel-size", str(cp), "--expert-model-parallel-size", str(ep),
            "--num-layers", str(layers), "--hidden-size", str(16 * heads),
            "--num-attention-heads", str(heads), "--seq-length", str(64 * cp),
            "--micro-batch-size", "1", "--distributed-backend", backend]
    if vp:
        argv += ["--virtual-pipeline-model-parallel-size", str(vp)]
    if order == TP_PP_DP_ORDER:
        argv.append("--use-tp-pp-dp-mapping")
    return argv + list(extra)
# --8<-- [end:pretrain-argv]


VIEWS = ("tree", "groups", "checks", "schedule")
# torch.optim imports torch._dynamo when the first optimizer is built: 3.5 s in every rank,
# unless the launching process imports it once before forking.
TRAINING_WARM = ("torch._dynamo",)


def _views(show: str, steps: int) -> set:
    if not show:
        return set(VIEWS) if steps else set(VIEWS) - {"schedule"}
    views = {v.strip() for v in show.split(",") if v.strip()}
    unknown = views - set(VIEWS)
    if unknown:
        raise UserError(f"--show {show!r}: unknown view {', '.join(sorted(unknown))}; choose from {', '.join(VIEWS)}")
    if "schedule" in views and not steps:
        raise UserError("--show schedule needs a training iteration: add --steps 1")
    return views


def training_argv(world: int, tp: int, pp: int, cp: int, steps: int) -> List[str]:
    """Flags for --steps N: N iterations on mock data, with 2 x pp micro-batches per global
    batch so the pipeline schedule has a steady state to show."""
    if not steps:
        return []
    dp = world // (tp * pp * cp) if world % (tp * pp * cp) == 0 else 1
    return ["--train-iters", str(steps), "--lr", "1e-4", "--mock-data", "--hidden-dropout", "0",
            "--attention-dropout", "0", "--global-batch-size", str(dp * 2 * pp)]


@app.command(context_settings=EXTRA)
def trace(
    ctx: typer.Context,
    world: int = typer.Option(..., "--world", "-w", help="number of ranks"),
    tp: int = typer.Option(1, "--tp", help="--tensor-model-parallel-size"),
    pp: int = typer.Option(1, "--pp", help="--pipeline-model-parallel-size"),
    cp: int = typer.Option(1, "--cp", help="--context-parallel-size"),
    ep: int = typer.Option(1, "--ep", help="--expert-model-parallel-size"),
    vp: Optional[int] = typer.Option(None, "--vp", help="--virtual-pipeline-model-parallel-size"),
    order: str = typer.Option(DEFAULT_ORDER, "--order", help=f"rank order: {ORDERS[0]} or {ORDERS[1]}"),
    backend: Optional[str] = typer.Option(None, "--backend", help="gloo (CPU ranks), nccl (GPU ranks) or fake "
                                                                  "(one process plays every rank; no communication)"),
    out: Path = typer.Option(Path("minitron-trace"), "--out", "-o", help="trace directory"),
    rank: int = typer.Option(0, "--rank", help="whose call tree to print"),
    steps: int = typer.Option(0, "--steps", help="training iterations to run and trace after initialization "
                                                  "(mock data); 0: initialization only"),
    show: str = typer.Option("", "--show", help="comma list of views: tree, groups, checks, schedule "
                                               "(default: all that apply)"),
    depth: Optional[int] = typer.Option(None, "--depth", help="call-tree depth (default: all; 7 with --steps)"),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="per-rank logs (default OUT/logs)"),
    master_port: Optional[int] = typer.Option(None, "--master-port", help="default: a free port"),
    debug: Optional[str] = DEBUG, debug_port_base: int = DEBUG_PORT_BASE, debug_host: str = DEBUG_HOST,
    debug_wait_timeout: float = DEBUG_WAIT,
):
    """Run the real initialization on WORLD ranks and show what every rank did.

    Megatron flags after `--` are passed to every rank (e.g. `-- --global-batch-size 8`).
    """
    from minitron.launcher import LaunchConfig, Target, launch
    from minitron.launcher.fake import play_ranks
    from minitron.trace import TRACE_DIR_ENV
    from minitron.trace.checks import check_trace
    from minitron.trace.export import load_trace, write_chrome_trace
    from minitron.trace.render import call_tree, check_lines, group_table

    check_world(world)
    check_order(order)
    backend = backend or default_backend()
    check_backend(backend, world)
    if not 0 <= rank < world:
        raise UserError(f"--rank {rank} is outside the world: choose 0..{world - 1}")
    if steps < 0:
        raise UserError(f"--steps must be 0 or more, got {steps}")
    views = _views(show, steps)
    argv = pretrain_argv(tp, pp, cp, ep, vp, order, backend, training_argv(world, tp, pp, cp, steps) + ctx.args)
    validate_pretrain(argv, world)
    debug_env = DebugOptions(debug, debug_port_base, debug_host, debug_wait_timeout).env(world)
    if steps and backend == "fake":
        raise UserError("--steps needs real communication: the fake backend moves no data; use gloo")
    if debug_env and backend == "fake":
        raise UserError("--debug needs real rank processes; use --backend gloo")
    preflight.check_launch(world, backend, master_port, {"--out": out, "--log-dir": log_dir})

    out.mkdir(parents=True, exist_ok=True)
    for stale in list(out.glob("rank*.jsonl")) + [out / "trace.json"]:
        stale.unlink(missing_ok=True)  # a previous, larger run must not leak ranks into this one
    started = time.perf_counter()
    if backend == "fake":
        play_ranks(world, argv, str(out))
    else:
        cfg = LaunchConfig(world_size=world, backend=backend, log_dir=log_dir or out / "logs",
                           master_port=master_port, env={TRACE_DIR_ENV: str(out.resolve()), **debug_env},
                           warm=TRAINING_WARM if steps else ())
        launch(cfg, Target(module="minitron.pretrain_gpt", argv=argv))
    elapsed = time.perf_counter() - started

    runs = load_trace(out)
    note = "fake backend: collectives did not communicate" if backend == "fake" else None
    chrome = write_chrome_trace(out, runs, note)
    if "tree" in views:
        console.print(call_tree(runs[rank], rank, depth if depth is not None else (7 if steps else None)))
    if "groups" in views:
        if world <= 64:
            console.print(group_table(runs))
        else:
            console.print(f"[dim](group table omitted for {world} ranks; see {chrome})[/dim]")
    if "schedule" in views:
        from minitron.trace.schedule_view import pipeline_steps, render_slots
        console.print(f"[bold]pipeline schedule of iteration {steps - 1}[/bold] "
                      f"(tensor rank 0, data rank 0; executed order):")
        console.print(render_slots(pipeline_steps(runs, iteration=steps - 1)))
    checks = check_trace(runs, fake=backend == "fake")
    if "checks" in views:
        for line in check_lines(checks):
            console.print(line)
    pids = len({recs[0]["pid"] for recs in runs.values() if recs})
    console.print(f"{world} ranks ({backend}, {pids} processes) in {elapsed:.2f} s → {out}/rank*.jsonl, "
                  f"{chrome} (open in https://ui.perfetto.dev)")
    if backend == "fake":
        console.print("[yellow]fake backend: one process played every rank; collectives moved no data[/yellow]")
    if not all(c.ok for c in checks):
        raise typer.Exit(1)
