"""`minitron estimate`: what pretrain's flags will cost each rank, before anything runs; and
`--check DIR`: the same prediction beside what a traced run really sent.

The flags are pretrain's, parsed and validated by the same code (cli/common.validate_pretrain),
so a layout estimate refuses is one pretrain would refuse, in the same words. The arithmetic
is minitron/training/theoretical_memory_usage.py; nothing here imports torch. The arithmetic,
the trace readers and DeepSpeed's config reader are imported inside the functions that use
them: every `minitron` command, `--help` included, imports this module.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Optional

import typer

from minitron.cli import preflight
from minitron.cli.common import EXTRA, UserError, app, check_world, console, print_no_effect, validate_pretrain
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
    from minitron.training.tokenizer import build_tokenizer

    args = validate_pretrain(argv, world)
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

    keys = list(dict.fromkeys(k for c in costs for k in c.comm))
    expected = expectation_keys(args)
    print_fitted(console, "bytes handed to collectives and sent point-to-point, one train_step",
                 ["ranks"] + [key + ("~" if key in expected else "") for key in keys],
                 [[rank_ranges(ranks), *[human(c.comm.get(k, 0)) for k in keys]] for ranks, c in rows]
                 + [["all", *[human(sum(c.comm.get(k, 0) for c in costs)) for k in keys]]], bold_last=True)
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
    console.print(f"model: {count(total)}{exact} parameters, the tied embedding once; {args.params_dtype}{engine}")
    console.print(f"largest rank: {big.rank} (stage {big.role[0]}) needs {human(sum(big.memory.values()))}", highlight=False)
    console.print("  " + ", ".join(f"{k} {human(big.memory[k])}" for k in MEMORY), highlight=False)


@app.command(context_settings=EXTRA)
def estimate(
    ctx: typer.Context,
    world: Optional[int] = typer.Option(None, "--world", "-w", help="number of ranks"),
    as_json: bool = typer.Option(False, "--json", help="print one JSON object, every rank expanded"),
    check: Optional[Path] = typer.Option(None, "--check", metavar="DIR",
                                         help="set the estimate beside what a traced run (pretrain --trace DIR) sent"),
    iteration_time: Optional[float] = typer.Option(None, "--iteration-time", metavar="SECONDS",
                                                   help="a measured or assumed time per iteration: prints the "
                                                        "TFLOP/s/GPU Megatron's --log-throughput would"),
    peak_tflops: Optional[str] = typer.Option(None, "--peak-tflops", metavar="TFLOPS|GPU",
                                              help="the device's dense peak (a number, or h100, h200, a100) "
                                                   "for MFU; needs --iteration-time"),
):
    """Predict each rank's parameters, memory and communication for pretrain's flags, starting
    nothing. Every other flag is pretrain's (--tp, --pp, --num-layers, --seq-length, ...)."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.training.theoretical_memory_usage import report_theoretical_memory as work_out, total_params
    from minitron.training.theoretical_moe import expectation_keys

    peak = _peak(peak_tflops, iteration_time, check)
    if check is not None:
        if ctx.args or world is not None:
            raise UserError("--check DIR reads the run's flags and world from its trace; drop the other flags")
        return check_trace(check, as_json)
    if world is None:
        raise UserError("--world W is required: the number of ranks to estimate for")
    check_world(world)
    preflight.check_world_limit(world, "estimate")  # before the layout's checks, which grow with it
    args = _args_for(list(ctx.args), world)
    costs = work_out(args)
    compute = _compute(args, iteration_time, peak)
    if as_json:
        out = {"total_params": total_params(args), **compute, "ranks": [c.as_json() for c in costs]}
        if expectation_keys(args):   # MoE without padding: these keys follow the routing
            out["expectation_keys"] = sorted(expectation_keys(args))
        if args.no_effect:           # the flags accepted without effect (arguments_policy.py)
            out["no_effect"] = args.no_effect
        print(json.dumps(out))
        return
    print_no_effect(args)
    render(args, costs, total_params(args))
    render_compute(args, compute, peak_tflops)


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


def check_trace(trace_dir: Path, as_json: bool) -> None:
    """Prediction against execution, rank by rank: the gradient buffer (DDP records its size)
    and the bytes of every group kind inside train_step."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.cli.views.diff import comm_by_key, recorded_args
    from minitron.cli.views.checks import layout_problem
    from minitron.trace.reader import TraceError, load_trace
    from minitron.training.theoretical_memory_usage import report_theoretical_memory as work_out
    from minitron.training.theoretical_moe import expectation_keys

    try:
        runs = load_trace(trace_dir, check=layout_problem)
    except TraceError as exc:
        raise UserError(str(exc)) from None
    recorded = recorded_args(runs)
    if recorded is None:
        raise UserError(f"{trace_dir} does not record the run's arguments (traced before minitron kept them, "
                        "or initialization only): trace `minitron pretrain --train-iters 1 --trace DIR` again")
    args = argparse.Namespace(**recorded)
    if getattr(args, "deepspeed", False):   # the stage and buckets are in the run's ds_config
        # lazy: loaded when the command runs, not by `minitron --help`
        from minitron.runtime import DeepSpeedConfig, DeepSpeedConfigError
        try:
            DeepSpeedConfig(args.deepspeed_config, world_size=args.data_parallel_size)
        except DeepSpeedConfigError as exc:
            raise UserError(f"{trace_dir} is a --deepspeed run whose ds_config cannot be read from here ({exc}); "
                            "run --check where the run started") from None
    if not any(r["name"].endswith(".train_step") for records in runs.values() for r in records):
        raise UserError(f"{trace_dir} holds no train_step: trace a training run (pretrain --train-iters 1 --trace DIR)")
    if getattr(args, "padded_vocab_size", None) is None:
        # lazy: loaded when the command runs, not by `minitron --help`
        from minitron.training.tokenizer import build_tokenizer
        build_tokenizer(args)
    costs = {c.rank: c for c in work_out(args)}
    expected = expectation_keys(args)   # MoE without padding: compared, not required equal
    report, bad = [], []
    for rank, records in runs.items():
        traced = {k: v[0] for k, v in comm_by_key(records, args.params_dtype).items()}
        buffer = _traced_buffer(records)
        c = costs[rank]
        exact = {k for k in (*traced, *c.comm) if k not in expected}
        ok = (all(traced.get(k) == c.comm.get(k) for k in exact)
              and buffer in (None, _grad_elements(args, c)))
        report.append((rank, c, traced, buffer, ok))
        if not ok:
            bad.append(rank)
    if as_json:
        out = {"ranks": [{"rank": r, "predicted": c.comm, "traced": t, "match": ok} for r, c, t, _, ok in report]}
        if expected:
            out["expectation_keys"] = sorted(expected)
        print(json.dumps(out))
    else:
        keys = list(dict.fromkeys([k for _, c, t, _, _ in report for k in (*c.comm, *t)]))
        rows = [[str(rank), _cell(_grad_elements(args, c), buffer, str)]
                + [(_deviation if k in expected else _cell)(c.comm.get(k, 0), traced.get(k, 0), human) for k in keys]
                for rank, c, traced, buffer, ok in report]
        print_fitted(console, f"predicted vs traced, one train_step: {trace_dir}",
                     ["rank", "grad buffer"] + [key + ("~" if key in expected else "") for key in keys], rows,
                     justify={0: "right"})
        if expected:
            console.print(f"~ {', '.join(sorted(expected))}: the balanced-routing expectation beside what the router "
                          "sent (deviation); pad to capacity to make them exact", highlight=False)
        if bad:
            skipped = _skipped_step(runs) and not getattr(args, "deepspeed", False)   # Megatron's step only
            console.print(f"[red]{len(bad)} of {len(report)} ranks differ from the estimate: {rank_ranges(bad)}[/red]"
                          + (" (the fp16 step was skipped for overflow: no norm, no all-gather)" if skipped else ""))
        elif expected:
            console.print(f"all {len(report)} ranks sent exactly the predicted bytes to every other group kind")
        else:
            console.print(f"all {len(report)} ranks sent exactly the predicted bytes to every group kind")
    if bad:
        raise typer.Exit(1)


def _deviation(expected, traced, fmt) -> str:
    """An expectation beside the measurement: 8 KiB ~ 8.25 KiB (+3.1%)."""
    if not expected:
        return fmt(traced)
    return f"{fmt(expected)} ~ {fmt(traced)} ({(traced - expected) / expected:+.1%})"


def _cell(predicted, traced, fmt) -> str:
    if traced is None:
        return fmt(predicted)
    if predicted == traced:
        return fmt(predicted)
    return f"[red]{fmt(predicted)} ≠ {fmt(traced)}[/red]"


def _grad_elements(args, cost) -> int:
    e = 4 if args.accumulate_allreduce_grads_in_fp32 else {"float32": 4}.get(args.params_dtype, 2)
    return cost.memory["grads"] // e


def _traced_buffer(records) -> Optional[int]:
    """Elements of the rank's gradient buffers, as DDP's finish_grad_sync records them."""
    sizes = [r["args"].get("numel") for r in records
             if r["name"].endswith("DistributedDataParallel.finish_grad_sync")]
    if not sizes or not all(isinstance(n, int) for n in sizes):
        return None
    # One record per model chunk and iteration: the first iteration's chunks.
    from minitron.cli.views.diff import inside
    from minitron.trace.reader import TRAIN_STEP
    first = next((r for r in records if r["name"] == TRAIN_STEP), None)
    if first is None:
        return None
    return sum(r["args"]["numel"] for r in inside(records, TRAIN_STEP)
               if r["name"].endswith("DistributedDataParallel.finish_grad_sync")
               and first["start_us"] <= r["start_us"] <= first["end_us"])


def _skipped_step(runs) -> bool:
    return not any(r["name"].endswith("get_grad_norm_fp32") for records in runs.values() for r in records)
