"""`minitron estimate`: what pretrain's flags will cost each rank, before anything runs; and
`--check DIR`: the same prediction beside what a traced run really sent.

The flags are pretrain's, parsed and validated by the same code (cli/common.validate_pretrain),
so a layout estimate refuses is one pretrain would refuse, in the same words. The arithmetic
is minitron/training/theoretical_memory_usage.py; nothing here imports torch. The arithmetic,
the trace readers and DeepSpeed's config reader are imported inside the functions that use
them: every `minitron` command, `--help` included, imports this module.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from minitron.cli import preflight
from minitron.cli.common import (EXTRA, UserError, app, check_world, console, print_no_effect, validate_pretrain,
                                 without_backend)
from minitron.cli.estimate_check import check_trace
from minitron.cli.estimate_offload import offload_rows, render_offload
from minitron.cli.estimate_time import compare_layouts, render_time, time_options
from minitron.cli.views.fitted_table import print_fitted
from minitron.cli.views.words import human, plural, rank_ranges

MEMORY = ("params", "grads", "optimizer", "activations")


def count(n: int) -> str:
    """Parameters: 175.0B, 1.61M, 84,160."""
    for unit, size in (("B", 10**9), ("M", 10**6)):
        if n >= size:
            return f"{n / size:.1f}{unit}" if n >= 10 * size else f"{n / size:.2f}{unit}"
    return f"{n:,}"


def _args_for(argv: list[str], world: int):
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.training.arguments_features import moe_training_refusal
    from minitron.training.tokenizer import build_tokenizer

    args = validate_pretrain(without_backend(argv), world)   # no rank runs: nccl needs no GPU here
    if moe_training_refusal(args):   # the step estimated is one pretrain would refuse to run
        raise UserError(moe_training_refusal(args))
    if getattr(args, "deepspeed", False):   # what the stage-3 estimate cannot count yet (theoretical_zeropp.py)
        # lazy: as above, and only a DeepSpeed job reads its ds_config here
        from minitron.training.theoretical_zero import ds_config
        from minitron.training.theoretical_zeropp import unestimated
        if unestimated(ds_config(args)):
            raise UserError(f"--deepspeed-config {args.deepspeed_config}: {unestimated(ds_config(args))}")
    try:
        build_tokenizer(args)   # sets padded_vocab_size, as the ranks will
    except (ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    return args


def _rows(costs) -> list[tuple[list[int], object]]:
    """Ranks of equal cost together, in rank order of their first member."""
    groups: dict[tuple, tuple[list[int], object]] = {}
    for c in costs:
        key = (c.params, tuple(c.memory.items()), tuple(c.comm.items()))
        groups.setdefault(key, ([], c))[0].append(c.rank)
    return list(groups.values())


def render(args, costs, total: int) -> None:
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.training.theoretical_moe import expectation_keys

    rows = _rows(costs)
    sums = {k: sum(c.memory[k] for c in costs) for k in MEMORY}
    print_fitted(console, f"memory per rank: {plural(args.world_size, 'rank')}, tp {args.tensor_model_parallel_size}"
                          f" × pp {args.pipeline_model_parallel_size} × dp {args.data_parallel_size}",
                 ["ranks", "pp", "params", "weights", "grads", "optim.", "activ.", "total"],
                 [[rank_ranges(ranks), str(c.role[0]), count(c.params), *[human(c.memory[k]) for k in MEMORY],
                   human(sum(c.memory.values()))] for ranks, c in rows]
                 + [["all", "", count(sum(c.params for c in costs)), *[human(sums[k]) for k in MEMORY],
                     human(sum(sums.values()))]], bold_last=True)

    every = list(dict.fromkeys(k for c in costs for k in c.comm))
    alone = _groups_of_one(args)
    keys = [k for k in every if k not in alone]
    expected = expectation_keys(args)
    if keys:
        print_fitted(console, "bytes handed to collectives and sent point-to-point, one train_step",
                     ["ranks"] + [key + ("~" if key in expected else "") for key in keys],
                     [[rank_ranges(ranks), *[human(c.comm.get(k, 0)) for k in keys]] for ranks, c in rows]
                     + [["all", *[human(sum(c.comm.get(k, 0) for c in costs)) for k in keys]]], bold_last=True)
    if len(keys) < len(every):
        console.print(f"{', '.join(k for k in every if k in alone)}: groups of one rank, whose calls send nothing"
                      + ("" if keys else "; no collective moves a byte"), highlight=False)
    if expected:
        console.print(f"~ {', '.join(sorted(expected))}: the expectation under balanced routing (tokens x topk / "
                      "experts per expert); the router decides. --moe-pad-expert-input-to-capacity makes it exact",
                      highlight=False)

    big = max(costs, key=lambda c: (sum(c.memory.values()), -c.rank))
    exact = f" ({total:,})" if count(total) != f"{total:,}" else ""
    engine = ""
    if getattr(args, "deepspeed", False):
        # lazy: loaded when the command runs, not by `minitron --help`
        from minitron.training.theoretical_zero import zero_stage
        engine = f"; DeepSpeed ZeRO-{zero_stage(args)}"
    embedding = ("the embedding and output layer untied" if args.untie_embeddings_and_output_weights
                 else "the tied embedding once")
    console.print(f"model: {count(total)}{exact} parameters, {embedding}; {args.params_dtype}{engine}")
    console.print(f"largest rank: {big.rank} (stage {big.role[0]}) needs {human(sum(big.memory.values()))}", highlight=False)
    console.print("  " + ", ".join(f"{k} {human(big.memory[k])}" for k in MEMORY), highlight=False)


def _groups_of_one(args) -> set[str]:
    """The group kinds whose groups hold one rank (tp at tp 1, tp-pp at tp = pp = 1): Megatron
    still calls the collectives there (the batch broadcast, the norm's all-reduce), and a trace
    records them, but they move nothing, so the table leaves them out."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.core.group_layout import rank_layout

    own = rank_layout(0, args.world_size, args.tensor_model_parallel_size, args.pipeline_model_parallel_size,
                      args.context_parallel_size, args.expert_model_parallel_size, args.order,
                      args.expert_tensor_parallel_size)   # rank 0 is in a group of every kind
    return {key for key, ranks in own.items() if len(ranks) == 1}


@app.command(context_settings=EXTRA)
def estimate(
    ctx: typer.Context,
    world: Optional[int] = typer.Option(None, "--world", "-w", help="number of ranks"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object, every rank expanded"),
    check: Optional[Path] = typer.Option(None, "--check", metavar="DIR",
                                         help="set the estimate beside what a traced run (pretrain --trace DIR) sent, "
                                              "iteration by iteration; exit 1 when a rank differs"),
    iteration_time: Optional[float] = typer.Option(None, "--iteration-time", metavar="SECONDS",
                                                   help="a measured or assumed time per iteration: prints the "
                                                        "TFLOP/s/GPU Megatron's --log-throughput would"),
    peak_tflops: Optional[str] = typer.Option(None, "--peak-tflops", metavar="TFLOPS|GPU",
                                              help="the device's dense peak (a number, or h100, h200, a100) "
                                                   "for MFU; needs --iteration-time"),
    cluster: Optional[str] = typer.Option(None, "--cluster", metavar="h100|h200|FILE",
                                          help="price the iteration in seconds on this cluster (a built-in "
                                               "node or a .json/.toml description): compute, bubble, each group"),
    mfu: Optional[float] = typer.Option(None, "--mfu", help="the fraction of peak compute reaches (default: "
                                                            "minitron's recorded one-H100 run); needs --cluster"),
    compare: Optional[list[str]] = typer.Option(None, "--compare", metavar="LAYOUT",
                                                help="rank layouts by iteration time, each as flags over the "
                                                     "others (\"tp=8,pp=16\"); repeat it; needs --cluster"),
):
    """Predict each rank's parameters, memory and communication for pretrain's flags, starting
    nothing. Every other flag is pretrain's (--tp, --pp, --num-layers, --seq-length, ...)."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.training.theoretical_memory_usage import report_theoretical_memory as work_out, total_params
    from minitron.training.theoretical_moe import expectation_keys
    from minitron.training.theoretical_offload import offloads

    peak = _peak(peak_tflops, iteration_time, check)
    described, mfu, mfu_source = time_options(cluster, mfu, compare, check, iteration_time)
    if check is not None:
        if ctx.args or world is not None:
            raise UserError("--check DIR reads the run's flags and world from its trace; drop the other flags")
        return check_trace(check, as_json)
    if world is None:
        raise UserError("--world W is required: the number of ranks to estimate for")
    check_world(world)
    preflight.check_world_limit(world, "estimate")  # before the layout's checks, which grow with it
    if compare:   # theoretical_time.py prices each layout; cli/estimate_time.py ranks them
        rows = compare_layouts(list(ctx.args), world, compare, described, mfu, mfu_source, _args_for, as_json)
        if as_json:
            print(json.dumps({"layouts": rows}))
        return
    args = _args_for(list(ctx.args), world)
    costs = work_out(args)
    compute = _compute(args, iteration_time, peak)
    if as_json:
        out = {"total_params": total_params(args), **compute, "ranks": [c.as_json() for c in costs]}
        if expectation_keys(args):   # MoE without padding: these keys follow the routing
            out["expectation_keys"] = sorted(expectation_keys(args))
        if args.no_effect:           # the flags accepted without effect (arguments_policy.py)
            out["no_effect"] = args.no_effect
        if getattr(args, "deepspeed", False) and offloads(args):   # ZeRO-Offload's host side, per stage's ranks
            out["offload"] = [{"ranks": ranks, **row} for ranks, row in offload_rows(args, costs)]
        if described:                # --cluster: seconds (theoretical_time.py)
            # lazy: loaded when the command runs, not by `minitron --help`
            from minitron.training.theoretical_time import iteration_time as priced
            out["time"] = priced(args, costs, described, mfu)
        print(json.dumps(out))
        return
    print_no_effect(args)
    render(args, costs, total_params(args))
    if getattr(args, "deepspeed", False) and offloads(args):   # host and swap bytes (estimate_offload.py)
        render_offload(args, costs)
    render_compute(args, compute, peak_tflops)
    if described:
        render_time(args, costs, described, mfu, mfu_source)


def _peak(text: Optional[str], iteration_time: Optional[float], check: Optional[Path]) -> Optional[float]:
    """--peak-tflops as a number (a GPU's name looked up), checked with --iteration-time."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.training.theoretical_flops import PEAK_TFLOPS

    if check is not None and (text is not None or iteration_time is not None):
        raise UserError("--iteration-time and --peak-tflops go with a prediction, not with --check DIR; drop them")
    if iteration_time is not None and not 0 < iteration_time < float("inf"):
        raise UserError(f"--iteration-time {iteration_time:g}: give the seconds one iteration takes, above 0")
    if text is None:
        return None
    if iteration_time is None:
        raise UserError("--peak-tflops needs --iteration-time SECONDS: MFU is the achieved TFLOP/s over the peak")
    if text.lower() in PEAK_TFLOPS:
        return PEAK_TFLOPS[text.lower()]
    try:
        peak = float(text)
    except ValueError:
        peak = float("nan")
    if not 0 < peak < float("inf"):
        raise UserError(f"--peak-tflops {text!r}: give the device's dense peak in TFLOP/s (a number above 0) "
                        f"or one of {', '.join(PEAK_TFLOPS)}")
    return peak


def _compute(args, iteration_time: Optional[float], peak: Optional[float]) -> dict:
    """FLOPs and tokens of one iteration; throughput and MFU when a time (and a peak) is given."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.training.theoretical_flops import num_floating_point_operations, throughput_per_gpu

    flops = num_floating_point_operations(args, args.global_batch_size)
    out = {"flops_per_iteration": flops, "tokens_per_iteration": args.global_batch_size * args.seq_length}
    if iteration_time is not None:
        out["throughput_per_gpu_tflops"] = throughput_per_gpu(flops, iteration_time, args.world_size)
        out["iteration_time_s"] = iteration_time
        if peak is not None:
            out["peak_tflops"] = peak
            out["mfu"] = out["throughput_per_gpu_tflops"] / peak
    return out


def flops_text(n: float) -> str:
    """5.47e+18 FLOPs as 5.47 EFLOP, the unit chosen so the number stays short."""
    for unit, size in (("E", 1e18), ("P", 1e15), ("T", 1e12), ("G", 1e9), ("M", 1e6)):
        if n >= size:
            return f"{n / size:.3g} {unit}FLOP"
    return f"{n:.3g} FLOP"


def render_compute(args, compute: dict, peak_name: Optional[str]) -> None:
    console.print(f"compute: {flops_text(compute['flops_per_iteration'])} per iteration, "
                  f"{compute['tokens_per_iteration']:,} tokens ({args.global_batch_size} × {args.seq_length}); "
                  "Megatron's count", highlight=False)
    if "throughput_per_gpu_tflops" in compute:
        achieved = compute["throughput_per_gpu_tflops"]
        line = (f"at {compute['iteration_time_s']:g} s per iteration: throughput per GPU (TFLOP/s/GPU): "
                + (f"{achieved:.1f}" if achieved >= 1 else f"{achieved:.3g}"))
        if "mfu" in compute:
            named = f" ({peak_name.lower()})" if peak_name and not peak_name[0].isdigit() else ""
            line += f", MFU {compute['mfu']:.1%} of {compute['peak_tflops']:g} TFLOP/s{named}"
        console.print(line, highlight=False)
