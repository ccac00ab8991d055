"""`minitron trace`: run the real initialization (and, with --steps, training iterations) on
every rank, then show one rank's call tree, the groups, the checks and the pipeline schedule."""

from __future__ import annotations

import importlib
import os
import sys
import time
from pathlib import Path
from typing import List, Optional

import typer

from minitron.cli.common import (
    CP, EP, PP, TP, vp_option, DEBUG, DEBUG_HOST, DEBUG_PORT_BASE, DEBUG_WAIT, EXTRA, ORDERS, DebugOptions, UserError, app, check_backend,
    check_order, check_world, console, default_backend, print_no_effect, validate_pretrain, HANG_TIMEOUT,
    check_hang_timeout, flag_value, hang_screen, without_backend,
)
from minitron.cli import preflight
from minitron.cli.preflight_memory import check_fits
from minitron.core.rank_generator import DEFAULT_ORDER, TP_PP_DP_ORDER, validate_parallel_sizes
from minitron.cli.trace_out import clear_meanwhile
from minitron.cli.views import trace_pictures
from minitron.training.argument_groups_hybrid import entry_module

MAX_STEPS = 100  # traced iterations: a few show the steady state, and each adds its calls to every rank's trace


def default_experts(tp: int, ep: int, extra: List[str]) -> List[str]:
    """The experts of minitron's own tiny model, where --ep needs some and the user's flags
    (``extra``) name none. At tp > 1 they come with --sequence-parallel (Megatron's MoE layer
    trains only with it) and --disable-bias-linear (expert slices carry no bias). A user who
    gives --num-experts owns the model: nothing is added to it, sequence parallelism included."""
    if ep == 1 or any(word == "--num-experts" or word.startswith("--num-experts=") for word in extra):
        return []
    return ["--num-experts", str(ep)] + (["--sequence-parallel", "--disable-bias-linear"] if tp > 1 else [])


def pretrain_argv(tp: int, pp: int, cp: int, ep: int, vp: Optional[int], order: str, backend: Optional[str],
                  extra: List[str]) -> List[str]:
    """Megatron flags for a tiny GPT in this layout; the user's own flags (``extra``) come last
    and win. The defaults always satisfy validate_args: layers divide by pp x vp, heads by tp."""
    layers = pp * max(vp or 1, 1)
    heads = 2 * tp
    argv = ["--tensor-model-parallel-size", str(tp), "--pipeline-model-parallel-size", str(pp),
            "--context-parallel-size", str(cp), "--expert-model-parallel-size", str(ep),
            "--num-layers", str(layers), "--hidden-size", str(16 * heads),
            "--num-attention-heads", str(heads), "--seq-length", str(64 * cp),
            "--micro-batch-size", "1"]
    if backend:
        argv += ["--distributed-backend", backend]
    argv += default_experts(tp, ep, extra)   # expert groups need experts to split
    if vp is not None:  # 0 too: the parser refuses it in Megatron's words
        argv += ["--virtual-pipeline-model-parallel-size", str(vp)]
    if order == TP_PP_DP_ORDER:
        argv.append("--use-tp-pp-dp-mapping")
    return argv + list(extra)


def _chosen_ranks(spec: Optional[str], world: int, backend: Optional[str]) -> Optional[List[int]]:
    """--ranks: a few ranks of a fake world, played alone (each one's groups follow from the
    layout, and a fake collective needs no peer); None: every rank."""
    if spec is None:
        return None
    if backend != "fake":
        raise UserError("--ranks plays chosen ranks of a fake world, without their peers: add --backend fake "
                        "(gloo and nccl run every rank, which talk to each other)")
    return preflight.parse_ranks(spec, world)


def _views(show: str, steps: int) -> set:
    # lazy, as every import below: `minitron --help` and bad input never load the views
    from minitron.cli.views.show import VIEWS, parse_views

    try:
        views = parse_views(show)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if views is None:
        return set(VIEWS) if steps else set(VIEWS) - {"schedule"}
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


def play_pretrain_rank(argv: List[str], init_only: bool = False, module: str = "minitron.pretrain_gpt") -> None:
    """One rank of a fake world: pretrain's initialization, then nothing left for the next rank."""
    # lazy: only --backend fake loads torch and the training stack into this process
    from minitron.training.training import INIT_ONLY_ENV, destroy_global_state
    run_main = importlib.import_module(module).run_main   # pretrain_gpt's, or pretrain_hybrid's

    if init_only:   # this process is a forked player: the variable leaves with it
        os.environ[INIT_ONLY_ENV] = "1"
    try:
        run_main(argv)  # the script's entry, as a real rank runs it (no iterations: no model)
    finally:
        destroy_global_state()  # the globals, every group, the (fake) world: the next rank starts clean


def _records_and_rows(rank: int, records: list, lines: list) -> tuple:
    """What a process playing fake ranks hands back for each: the rank's records as a trace
    directory reads them, and its rows of trace.json, encoded (from the records' own lines)."""
    # lazy: only --backend fake plays ranks in this process
    from minitron.cli.views.perfetto import encoded_rank_events
    from minitron.trace.group_ranks import expand_group
    from minitron.trace.reader import in_trace_order
    from minitron.trace.schema import MAX_WORLD

    line_of = {id(record): line for record, line in zip(records, lines)}
    records = in_trace_order(records)
    for record in records:   # a large group's ranks, written compactly, become a list as the reader makes them
        expand_group(record, MAX_WORLD)
    return records, encoded_rank_events(rank, records, [line_of[id(record)] for record in records])


@app.command(context_settings=EXTRA)
def trace(
    ctx: typer.Context,
    world: int = typer.Option(..., "--world", "-w", help="number of ranks"),
    tp: int = TP, pp: int = PP, cp: int = CP, ep: int = EP,
    vp: Optional[int] = vp_option("model chunks per pipeline stage (interleaved schedule)"),
    order: str = typer.Option(DEFAULT_ORDER, "--order", help=f"rank order: {ORDERS[0]} or {ORDERS[1]}"),
    backend: Optional[str] = typer.Option(None, "--backend", help="gloo (CPU ranks), nccl (GPU ranks) or fake "
                                                                  "(ranks played in turn, one process per core; no communication)"),
    out: Path = typer.Option(Path("minitron-trace"), "--out", "-o", help="trace directory"),
    ranks: Optional[str] = typer.Option(None, "--ranks", help="fake backend: play only these ranks of the world "
                                                               "(0,12345,131071 or 0-3; worlds up to 131072)"),
    rank: Optional[int] = typer.Option(None, "--rank", help="whose call tree to print (default: the first rank)"),
    steps: int = typer.Option(0, "--steps", help="training iterations to run and trace after initialization "
                                                  "(mock data); 0: initialization only"),
    show: str = typer.Option("", "--show", help="comma list of views: tree, groups, checks, schedule "
                                               "(default: all that apply)"),
    svg: bool = typer.Option(False, "--svg", help="also draw the groups (groups.svg; with --ranks, nodes.svg: the "
                                                  "nodes holding --rank's groups) and, with --steps, the "
                                                  "schedule (schedule.svg) next to trace.json"),
    depth: Optional[int] = typer.Option(None, "--depth", help="call-tree depth (default: all; 7 with --steps "
                                                                     "unless --focus)"),
    focus: Optional[str] = typer.Option(None, "--focus", help="show only the calls named NAME (a function name "
                                                              "or pattern: train_step, '*forward*') and what ran inside"),
    log_dir: Optional[Path] = typer.Option(None, "--log-dir", help="per-rank logs (default OUT/logs)"),
    master_port: Optional[int] = typer.Option(None, "--master-port", help="default: a free port"),
    debug: Optional[str] = DEBUG, debug_port_base: int = DEBUG_PORT_BASE, debug_host: str = DEBUG_HOST,
    debug_wait_timeout: float = DEBUG_WAIT, hang_timeout: Optional[float] = HANG_TIMEOUT,
):
    """Run the real initialization on WORLD ranks and show what every rank did.

    Megatron flags after `--` are passed to every rank (e.g. `-- --global-batch-size 8`).
    """
    check_world(world)
    # First the sizes, each check costing microseconds: the layout's own checks grow with the
    # world, and a user's bad --debug option must not wait for them (or for torch).
    chosen = _chosen_ranks(ranks, world, backend)
    preflight.check_world_limit(world, backend or "gloo", played=len(chosen) if chosen else None)
    check_order(order)
    debugging = DebugOptions(debug, debug_port_base, debug_host, debug_wait_timeout)
    debugging.check(world)
    check_hang_timeout(hang_timeout, True)   # a trace always records: --out
    if hang_timeout and backend == "fake":
        raise UserError("--hang-timeout watches real ranks; fake collectives never wait: use --backend gloo")
    if backend is not None:  # given: check it now (the default is known after validation)
        check_backend(backend, world)
    # The flags after `--` may size the experts' tensor parallelism or order the ranks: this
    # check must see them (a bad value is validate_args' to refuse, below).
    expert_tp = flag_value(ctx.args, "--expert-tensor-parallel-size")
    expert_tp = int(expert_tp) if expert_tp and expert_tp.isdigit() else None
    if "--use-tp-pp-dp-mapping" in ctx.args:
        order = TP_PP_DP_ORDER
    try:  # the layout's one home (validate_args asks it again, with the flags after `--`)
        validate_parallel_sizes(world, tp, pp, cp, ep, expert_tp, vp, order)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    rank = (chosen[0] if chosen else 0) if rank is None else rank
    if not 0 <= rank < world:
        raise UserError(f"--rank {rank} is outside the world: choose 0..{world - 1}")
    if chosen and rank not in chosen:
        raise UserError(f"--rank {rank} is not one of --ranks {ranks}: choose one of the ranks played")
    if not 0 <= steps <= MAX_STEPS:
        raise UserError(f"--steps must be 0..{MAX_STEPS}, got {steps} (every step adds each call it makes to "
                        "every rank's trace; a schedule reads well after a few)")
    if depth is not None and depth < 1:
        raise UserError(f"--depth must be 1 or more, got {depth}")
    views = _views(show, steps)
    extra = without_backend(ctx.args) if backend == "fake" else ctx.args   # a fake play asks for no GPU
    argv = pretrain_argv(tp, pp, cp, ep, vp, order, backend, training_argv(world, tp, pp, cp, steps) + extra)
    # Every refusal of the flags happens before torch is imported; the default backend is
    # decided once they pass, as the ranks will decide it (torch-free on a machine without GPUs).
    args = validate_pretrain(argv, world)
    # lazy, as validate_pretrain's import: the rule lives with the training arguments
    from minitron.training.arguments_features import moe_setup_warning, moe_training_refusal
    if steps and moe_training_refusal(args):   # Megatron's MoE layer would raise at the first step
        raise UserError(moe_training_refusal(args))
    # Rank 0 prints the list as Megatron prints its arguments, and a fake play shows rank 0's
    # output here: said once, by whoever is seen (real ranks' output goes to their logs).
    if not (args.distributed_backend == "fake" and (chosen is None or 0 in chosen)):
        print_no_effect(args)
    backend = args.distributed_backend
    if backend != "fake":   # a fake play builds no DataLoader, so a real job's --num-workers starts nothing
        preflight.check_data_workers(args.num_workers, world)
    if steps and backend == "fake":
        raise UserError("--steps needs real communication: the fake backend moves no data; use gloo")
    if debug and backend == "fake":
        raise UserError("--debug needs real rank processes; use --backend gloo")
    if backend is None:  # torch-free where the machine has no GPU (default_backend)
        backend = default_backend(world)
        check_backend(backend, world)
        argv += ["--distributed-backend", backend]   # the ranks run what the launcher starts
    if steps:  # a model is built: it must fit
        check_fits(args, backend)
    preflight.check_launch(world, backend, master_port, {"--out": out, "--log-dir": log_dir},
                           played=len(chosen) if chosen else None)

    # The previous run's files go in a forked child, while this process imports torch below.
    cleared = clear_meanwhile(out, set(chosen) if chosen else range(world))
    # lazy: the views and the launcher load once the input has passed every check above
    from minitron.cli.views.call_tree import FocusError
    from minitron.cli.views.perfetto import write_chrome_trace
    from minitron.cli.views.show import default_depth, show_views
    from minitron.trace.reader import TraceError, load_trace
    from minitron.cli.views.words import plural
    from minitron.launcher import LaunchConfig, Target, launch
    from minitron.launcher.fake import play_ranks

    rank_env = debugging.env(world, out)
    # The flags may carry a real job's run length (a script's --train-iters 500000): without
    # --steps a trace is initialization only, so the ranks are told to stop there.
    init_only = not steps and bool(args.train_iters)
    if init_only:
        # lazy: the name lives with pretrain(), which reads it; loaded once the input has passed
        from minitron.training.training import INIT_ONLY_ENV
        rank_env = {**rank_env, INIT_ONLY_ENV: "1"}
        console.print(f"initialization only: the flags ask for {args.train_iters:,} iterations; a trace runs "
                      "none without --steps", highlight=False)

    if "--sequence-parallel" in default_experts(tp, ep, ctx.args) and "--sequence-parallel" not in ctx.args:
        console.print(f"minitron's default experts (--num-experts {ep}) at tp {tp} come with --sequence-parallel "
                      "--disable-bias-linear: Megatron's MoE layer trains at tp > 1 only with sequence "
                      "parallelism, and expert slices carry no bias", highlight=False, soft_wrap=True)
    if not steps and moe_setup_warning(args):   # the flags initialize; a step would be refused
        console.print(moe_setup_warning(args), highlight=False, markup=False, soft_wrap=True)

    cleared()  # before any rank writes there
    started = time.perf_counter()
    note = "fake backend: collectives did not communicate" if backend == "fake" else None
    if backend == "fake":
        # The processes that play the ranks hand back each rank's records and its encoded
        # rows of trace.json: a thousand ranks' files are not parsed again here.
        kept = play_ranks(world, lambda: play_pretrain_rank(argv, init_only, entry_module(args)), out, ranks=chosen,
                          keep=_records_and_rows)
        elapsed = time.perf_counter() - started
        runs = {r: records for r, (records, _) in kept.items()}
        chrome = write_chrome_trace(out, runs, note, encoded={r: text for r, (_, text) in kept.items()})
    else:
        cfg = LaunchConfig(world_size=world, backend=backend, log_dir=log_dir or out / "logs",
                           master_port=master_port, env=rank_env,
                           warm=LaunchConfig.warm if steps else (),  # no steps: no optimizer to warm for
                           hang_timeout=hang_timeout)
        launch(cfg, Target(module=entry_module(args), argv=argv), on_hang=hang_screen() if hang_timeout else None)
        elapsed = time.perf_counter() - started
        try:
            runs = load_trace(out)
        except TraceError as exc:  # the ranks ran, but what they wrote is not a trace: say so, once
            print(f"minitron: the ranks' trace cannot be read: {exc}", file=sys.stderr)
            raise typer.Exit(1) from None
        chrome = write_chrome_trace(out, runs, note)
    pictures = trace_pictures.write_pictures(out, runs, rank) if svg else []
    try:
        checks = show_views(console, runs, views, rank, focus=focus,
                            depth=depth if depth is not None else default_depth(runs, focus),
                            iteration=steps - 1 if steps else None, chrome=chrome)
    except FocusError as exc:
        raise UserError(f"{exc} (the trace is in {out}: `minitron view {out} --focus ...` reads it again)") from None
    pids = len({recs[0]["pid"] for recs in runs.values() if recs})
    played = f"{len(runs)} of {world:,} ranks" if chosen else plural(world, 'rank')
    console.print(f"{played} ({backend}, {plural(pids, 'process', 'processes')}) in {elapsed:.2f} s "
                  f"→ {out}/rank*.jsonl, {chrome} (open in https://ui.perfetto.dev)")
    if pictures:
        console.print("pictures: " + ", ".join(str(p) for p in pictures))
    if backend == "fake":
        console.print("[yellow]fake backend: ranks played in turn, no process of their own; collectives moved no data[/yellow]")
    if any(c.ok is False for c in checks):
        raise typer.Exit(1)
