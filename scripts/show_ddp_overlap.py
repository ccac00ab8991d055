"""When each gradient bucket and parameter bucket travelled, against forward and backward.

    minitron pretrain --world 2 ... --overlap-grad-reduce --overlap-param-gather --trace DIR
    python scripts/show_ddp_overlap.py DIR [--iteration N] [--rank R] [--width W]

Reads a traced run and draws one iteration of one rank (default: the last iteration, rank 0)
as lanes of text on one time axis: the compute (F forward, B backward, R finalize_model_grads'
reductions, O the optimizer step), then one lane per bucket and direction:

    ^  the collective was launched (async_op=True) and the call returned
    ~  in flight: launched, not yet waited for; the program computed meanwhile
    W  the program waited for it (finish_grad_sync, or the forward pre-hook's wait)

A reduction launched inside B and waited for in R overlapped that much backward; an all-gather
launched in one F and waited for in a later one overlapped forward. Times are the wall clock of
this run; on gloo the collective runs on a background thread of the same CPU, so a ~ stretch
says when the bytes *could* move, not that they moved then.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from minitron.trace.reader import TRAIN_STEP, TraceError, load_trace

SCHEDULES = "minitron.core.pipeline_parallel.schedules."
GROUP = "minitron.core.distributed.param_and_grad_buffer._ParamAndGradBucketGroup."
COMPUTE = {SCHEDULES + "forward_step": "F", SCHEDULES + "backward_step": "B",
           "minitron.core.distributed.finalize_model_grads.finalize_model_grads": "R",
           "minitron.core.optimizer.optimizer.MegatronOptimizer.step": "O"}
# (launch record, wait record, lane name) of each direction
KINDS = (("start_grad_sync", "finish_grad_sync", "grads"), ("start_param_sync", "_wait_param_gather", "params"))


def lanes(records: list[dict], step: dict) -> tuple[list[tuple[float, float, str]], dict]:
    """(compute spans, {lane: [(launched, wait_start, wait_end)]}) in µs from the step's start."""
    t0 = step["start_us"]
    inside = [r for r in records if step["start_us"] <= r["start_us"] and r["end_us"] <= step["end_us"]]
    compute = [(r["start_us"] - t0, r["end_us"] - t0, COMPUTE[r["name"]]) for r in inside if r["name"] in COMPUTE]
    buckets: dict[str, list] = {}
    for launch, wait, direction in KINDS:
        waits = {}
        for r in inside:
            if r["name"] == GROUP + wait:
                waits.setdefault(r["args"]["bucket"], []).append(r)
        for r in inside:
            if r["name"] != GROUP + launch or not r["args"].get("async"):
                continue
            bucket = r["args"]["bucket"]
            # The wait that follows this launch (the first wait of the bucket after it ends).
            w = next((w for w in waits.get(bucket, []) if w["end_us"] >= r["end_us"]), None)
            if w is not None:
                buckets.setdefault(f"bucket {bucket} {direction}", []).append(
                    (r["start_us"] - t0, max(w["start_us"], r["end_us"]) - t0, w["end_us"] - t0))
    return compute, dict(sorted(buckets.items(), key=lambda kv: (kv[0].split()[2], int(kv[0].split()[1]))))


def draw(compute, buckets, length_us: float, width: int) -> list[str]:
    scale = length_us / width

    def cell(t: float) -> int:
        return min(width - 1, int(t / scale))

    def lane(marks) -> str:
        row = [" "] * width
        for start, end, char in marks:   # later marks overwrite earlier ones
            for i in range(cell(start), cell(end) + 1):
                row[i] = char
        return "".join(row)

    name_w = max([7, *map(len, buckets)])
    lines = [f"{'compute':<{name_w}} |{lane(compute)}|"]
    for name, spans in buckets.items():
        marks = []
        for launched, wait_start, wait_end in spans:
            marks += [(launched, wait_start, "~"), (wait_start, wait_end, "W"), (launched, launched, "^")]
        lines.append(f"{name:<{name_w}} |{lane(marks)}|")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("trace_dir", type=Path)
    parser.add_argument("--iteration", type=int, default=None, help="1, 2, ... (default: the last)")
    parser.add_argument("--rank", type=int, default=0)
    parser.add_argument("--width", type=int, default=60, help="characters of the time axis")
    args = parser.parse_args(argv)
    try:
        runs = load_trace(args.trace_dir)
    except TraceError as exc:
        parser.error(str(exc))
    if args.rank not in runs:
        parser.error(f"no rank {args.rank} in {args.trace_dir}: it holds ranks {sorted(runs)}")
    records = runs[args.rank]
    steps = [r for r in records if r["name"] == TRAIN_STEP]
    if not steps or not 1 <= (args.iteration or len(steps)) <= len(steps) or args.width < 10:
        parser.error(f"{args.trace_dir} holds {len(steps)} train_step(s) on rank {args.rank}: "
                     "pick --iteration among them (and a --width of at least 10)")
    step = steps[(args.iteration or len(steps)) - 1]
    compute, buckets = lanes(records, step)
    length = step["end_us"] - step["start_us"]
    print(f"iteration {args.iteration or len(steps)} on rank {args.rank}: {length / 1000:.1f} ms, "
          f"one character = {length / args.width / 1000:.2f} ms")
    print("\n".join(draw(compute, buckets, length, args.width)))
    if not buckets:
        print("(no asynchronous bucket collective in this iteration: run with --overlap-grad-reduce, "
              "and look past the first iteration)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
