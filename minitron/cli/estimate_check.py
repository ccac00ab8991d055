"""`minitron estimate --check DIR`: the prediction beside what a traced run really sent, rank by
rank and iteration by iteration.

The estimate is one train_step's traffic, so a trace is cut into its train_steps (each rank's
records under each train_step call) and every iteration is compared on its own: a run of two
iterations sends twice the bytes of one, and that is no difference. The run's arguments come
from its own trace (set_global_variables records them); they are checked against Megatron's
flags before the estimator reads them, so a damaged record is one line, not a traceback.

Exit status: 0 when every rank sent the predicted bytes in every iteration, 1 when one differs,
2 when the directory cannot be checked (no trace, no arguments, no train_step).
"""

from __future__ import annotations

import argparse
import json
import reprlib
from pathlib import Path
from typing import NamedTuple, Optional

import typer

from minitron.cli.common import UserError, console
from minitron.cli.views.fitted_table import print_fitted
from minitron.cli.views.words import human, rank_ranges

# What validate_args derives rather than parses: the estimator reads these too.
DERIVED = ("world_size", "data_parallel_size", "expert_data_parallel_size")


def check_trace(trace_dir: Path, as_json: bool) -> None:
    """Prediction against execution: the gradient buffer (DDP records its size) and the bytes
    of every group kind inside each train_step. Raises typer.Exit(1) when any rank differs."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.cli.views.checks import layout_problem
    from minitron.cli.views.diff import recorded_args
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
    args = checked_args(trace_dir, recorded)
    if getattr(args, "deepspeed", False):   # the stage and buckets are in the run's ds_config
        # lazy: loaded when the command runs, not by `minitron --help`
        from minitron.runtime import DeepSpeedConfig, DeepSpeedConfigError
        try:
            DeepSpeedConfig(args.deepspeed_config, world_size=args.data_parallel_size)
        except DeepSpeedConfigError as exc:
            raise UserError(f"{trace_dir} is a --deepspeed run whose ds_config cannot be read from here ({exc}); "
                            "run --check where the run started") from None
    steps = {rank: train_steps(records) for rank, records in runs.items()}
    if not any(steps.values()):
        raise UserError(f"{trace_dir} holds no train_step: trace a training run (pretrain --train-iters 1 --trace DIR)")
    costs = {c.rank: c for c in work_out(args)}
    expected = expectation_keys(args)   # MoE without padding: compared, not required equal
    report = [row for rank in runs for row in _rank_rows(args, costs[rank], steps[rank], expected)]
    bad = sorted({row.cost.rank for row in report if not row.ok})
    if as_json:
        _print_json(report, expected)
    else:
        _print_table(trace_dir, args, report, expected, bad)
    if bad:
        raise typer.Exit(1)


def checked_args(trace_dir: Path, recorded: dict) -> argparse.Namespace:
    """The recorded arguments as a Namespace, each value checked against the flag it came from
    (a flag the record lacks, from an older minitron, takes its default) and the layout's sizes
    against the world; then the tokenizer's padded vocabulary, as the ranks worked it out."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.core.rank_generator import validate_parallel_sizes
    from minitron.training.arguments import megatron_parser
    from minitron.training.theoretical_params import DTYPE_BYTES
    from minitron.training.tokenizer import build_tokenizer

    def malformed(what: str) -> UserError:
        return UserError(f"{trace_dir}: the run's recorded arguments are malformed ({what}); "
                         "trace the run again with this minitron (pretrain --trace DIR)")

    values = dict(recorded)
    for action in megatron_parser()._actions:
        if action.default == argparse.SUPPRESS:  # --help
            continue
        if action.dest == "no_effect":   # the names of the flags accepted to no effect, not one flag's value
            continue
        if action.dest not in values:
            values.setdefault(action.dest, action.default)
        elif not _fits(action, values[action.dest]):
            raise malformed(f"{action.dest} is {reprlib.repr(values[action.dest])}")
    for key in DERIVED:
        if not (type(values.get(key)) is int and values[key] >= 1):
            raise malformed(f"{key} is {reprlib.repr(values.get(key))}, not a size")
    if values.get("params_dtype") not in DTYPE_BYTES:
        raise malformed(f"params_dtype is {reprlib.repr(values.get('params_dtype'))}, not one of {', '.join(DTYPE_BYTES)}")
    args = argparse.Namespace(**values)
    try:
        sizes = validate_parallel_sizes(args.world_size, args.tensor_model_parallel_size,
                                        args.pipeline_model_parallel_size, args.context_parallel_size,
                                        args.expert_model_parallel_size, args.expert_tensor_parallel_size,
                                        order=args.order)
    except (ValueError, TypeError) as exc:   # TypeError: an order that is not a string
        raise malformed(str(exc)) from None
    if (sizes["dp"], sizes["expert_dp"]) != (args.data_parallel_size, args.expert_data_parallel_size):
        raise malformed(f"data_parallel_size {args.data_parallel_size} and expert_data_parallel_size "
                        f"{args.expert_data_parallel_size}, where the layout gives {sizes['dp']} and {sizes['expert_dp']}")
    if getattr(args, "padded_vocab_size", None) is None:
        try:
            build_tokenizer(args)   # sets padded_vocab_size, as the ranks did
        except (ValueError, OSError) as exc:
            raise UserError(f"{trace_dir}: {exc}") from None
    return args


def _fits(action, value) -> bool:
    """Whether ``value`` is one the flag could hold after validate_args: None only where the
    flag may be left unset, a bool for a switch, else what the flag's own type parses the
    value's text to (so an int flag holds an int in its range, a choice one of its choices)."""
    if value == action.default:                 # what the run had when the flag was not given
        return True
    if value is None:
        return action.default is None
    if action.nargs == 0:                       # a switch (and the flags accepted to no effect)
        return isinstance(value, bool) or action.default is None
    if action.nargs not in (None, "?"):         # several values: each must fit
        return isinstance(value, list) and all(_fits_one(action, v) for v in value)
    return _fits_one(action, value)


def _fits_one(action, value) -> bool:
    if isinstance(value, bool):
        return False                            # no flag with a value parses to True or False
    if action.choices is not None and value not in action.choices:
        return False
    if isinstance(value, list):                 # a window (two ints) or a layer pattern (0s and 1s)
        return all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    parse = action.type or str
    try:
        return parse(str(value)) == value
    except (ValueError, TypeError, argparse.ArgumentTypeError):
        return False


def train_steps(records: list[dict]) -> list[tuple[int, list[dict]]]:
    """A rank's train_steps in the order they ran, each as (iteration, the step's record and
    every record under it). A step without a recorded iteration is numbered by its place."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.trace.reader import TRAIN_STEP

    by_id = {r["id"]: r for r in records}
    owner: dict[int, Optional[int]] = {}   # record id -> id of the train_step it ran in

    def step_of(record) -> Optional[int]:
        chain, found = [], None
        while record is not None:
            if record["id"] in owner:
                found = owner[record["id"]]
                break
            chain.append(record["id"])
            if record["name"] == TRAIN_STEP:
                found = record["id"]
                break
            record = by_id.get(record["parent"])
        for i in chain:
            owner[i] = found
        return found

    inside: dict[int, list[dict]] = {r["id"]: [] for r in records if r["name"] == TRAIN_STEP}
    for r in records:
        step = step_of(r)
        if step is not None:
            inside[step].append(r)
    ordered = sorted((by_id[i] for i in inside), key=lambda r: r["start_us"])
    return [(_iteration(step, n), inside[step["id"]]) for n, step in enumerate(ordered)]


def _iteration(step: dict, place: int) -> int:
    value = step["args"].get("iteration")
    return value if isinstance(value, int) and not isinstance(value, bool) else place


class Row(NamedTuple):
    """What a rank sent in some of its iterations (those that sent the same), against its cost."""
    cost: object            # theoretical_memory_usage's RankCost: .rank, .comm, .memory
    iterations: list
    traced: dict            # group key -> bytes handed, in one of these iterations
    buffer: Optional[int]   # gradient-buffer elements DDP recorded (None: not recorded)
    skipped: bool           # no gradient norm taken: Megatron's fp16 step skipped for overflow
    ok: bool


def _rank_rows(args, cost, steps, expected) -> list[Row]:
    """One row per distinct outcome of a rank's iterations."""
    # lazy: loaded when the command runs, not by `minitron --help`
    from minitron.cli.views.diff import comm_by_key

    if not steps:   # this rank recorded no train_step while others did: it sent nothing predicted
        return [Row(cost, [], {}, None, False, False)]
    outcomes: dict[tuple, list[int]] = {}
    for iteration, records in steps:
        traced = {k: v[0] for k, v in comm_by_key(records, args.params_dtype).items()}
        outcomes.setdefault((tuple(traced.items()), _buffer(records), _skipped(records)), []).append(iteration)
    rows = []
    for (traced, buffer, skipped), iterations in outcomes.items():
        traced = dict(traced)
        exact = {k for k in (*traced, *cost.comm) if k not in expected}
        ok = (all(traced.get(k) == cost.comm.get(k) for k in exact)
              and buffer in (None, grad_elements(args, cost)))
        rows.append(Row(cost, sorted(iterations), traced, buffer, skipped, ok))
    return rows


def _buffer(records: list[dict]) -> Optional[int]:
    """Elements of one step's gradient buffers: DDP's finish_grad_sync records each chunk's."""
    sizes = [r["args"].get("numel") for r in records
             if r["name"].endswith("DistributedDataParallel.finish_grad_sync")]
    if not sizes or not all(isinstance(n, int) for n in sizes):
        return None
    return sum(sizes)


def _skipped(records: list[dict]) -> bool:
    """Megatron's fp16 step skipped for overflow: no gradient norm was taken in it."""
    return not any(r["name"].endswith("get_grad_norm_fp32") for r in records)


def grad_elements(args, cost) -> int:
    e = 4 if args.accumulate_allreduce_grads_in_fp32 else {"float32": 4}.get(args.params_dtype, 2)
    return cost.memory["grads"] // e


def traced_buffer(records: list[dict]) -> Optional[int]:
    """Elements of a rank's gradient buffers in its first train_step (None: not recorded)."""
    steps = train_steps(records)
    return _buffer(steps[0][1]) if steps else None


def _print_json(report: list[Row], expected) -> None:
    """Per rank: the prediction, the first iteration's bytes ("traced", one train_step's, as
    before traces had more than one), and every iteration's under "iterations"."""
    ranks: dict[int, dict] = {}
    for row in report:
        entry = ranks.setdefault(row.cost.rank, {"rank": row.cost.rank, "predicted": row.cost.comm, "iterations": []})
        entry["iterations"] += [{"iteration": i, "traced": row.traced, "match": row.ok} for i in row.iterations]
    for entry in ranks.values():
        entry["iterations"].sort(key=lambda e: e["iteration"])
        entry["traced"] = entry["iterations"][0]["traced"] if entry["iterations"] else {}
        entry["match"] = bool(entry["iterations"]) and all(e["match"] for e in entry["iterations"])
    out: dict = {"ranks": list(ranks.values())}
    if expected:
        out["expectation_keys"] = sorted(expected)
    print(json.dumps(out))


def _print_table(trace_dir: Path, args, report: list[Row], expected, bad: list[int]) -> None:
    done = sorted({i for row in report for i in row.iterations})
    many = len(done) > 1   # an iteration column only when there is more than one
    keys = list(dict.fromkeys(k for row in report for k in (*row.cost.comm, *row.traced)))
    rows = [[str(row.cost.rank)] + ([_iterations(row.iterations)] if many else [])
            + [_cell(grad_elements(args, row.cost), row.buffer, str)]
            + [(_deviation if k in expected else _cell)(row.cost.comm.get(k, 0), row.traced.get(k, 0), human)
               for k in keys]
            for row in report]
    each = f"each train_step (iterations {_iterations(done)})" if many else "one train_step"
    print_fitted(console, f"predicted vs traced, {each}: {trace_dir}",
                 ["rank"] + (["iteration"] if many else []) + ["grad buffer"]
                 + [key + ("~" if key in expected else "") for key in keys], rows,
                 justify={0: "right", 1: "right"} if many else {0: "right"})
    if expected:
        console.print(f"~ {', '.join(sorted(expected))}: the balanced-routing expectation beside what the router "
                      "sent (deviation); pad to capacity to make them exact", highlight=False)
    ranks = len({row.cost.rank for row in report})
    if bad:
        skipped = sorted({i for row in report if not row.ok and row.skipped for i in row.iterations})
        why = ""
        if skipped and not getattr(args, "deepspeed", False):   # Megatron's step only
            why = (f" (the fp16 step of iteration {_iterations(skipped)} was skipped for overflow: "
                   "no norm, no all-gather)")
        console.print(f"[red]{len(bad)} of {ranks} ranks differ from the estimate: {rank_ranges(bad)}[/red]{why}")
        return
    what = "every other group kind" if expected else "every group kind"
    each = f" in each of {len(done)} iterations" if many else ""
    console.print(f"all {ranks} ranks sent exactly the predicted bytes to {what}{each}")


def _iterations(iterations: list[int]) -> str:
    """0, or 0-3, or 0,2: which iterations a row stands for."""
    return rank_ranges(iterations).strip("[]")


def _deviation(expected, traced, fmt) -> str:
    """An expectation beside the measurement: 8 KiB ~ 8.25 KiB (+3.1%)."""
    if not expected:
        return fmt(traced)
    return f"{fmt(expected)} ~ {fmt(traced)} ({(traced - expected) / expected:+.1%})"


def _cell(predicted, traced, fmt) -> str:
    if traced is None or predicted == traced:
        return fmt(predicted)
    return f"[red]{fmt(predicted)} ≠ {fmt(traced)}[/red]"
