"""validate_args and the micro-batch calculator on a few command lines. Chapter 4 runs this.

    python docs/examples/batch_demo.py validate   # what validate_args derives, or rejects
    python docs/examples/batch_demo.py rampup     # the global batch growing during ramp-up
    python docs/examples/batch_demo.py step       # the batches of a --step-batch-size-schedule

Each case goes through the real functions: parse_args, validate_args, set_global_variables and
get_num_microbatches for `validate`; the ramp-up calculator, moved along as train() does, for
`rampup`; for `step`, the walk validate_args makes of a step schedule before launch.
"""

from __future__ import annotations

import sys

# A tiny model, so each case differs from the others only in what it is about.
MODEL = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4",
         "--seq-length", "32", "--distributed-backend", "gloo"]

# (world size, the flags that matter for this case)
CASES = [
    (16, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 16"),
    (16, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --micro-batch-size 2"),
    (8, "--tensor-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 32 --bf16"),
    (16, "--tensor-model-parallel-size 3 --micro-batch-size 1"),
    (16, "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2 --micro-batch-size 2 --global-batch-size 20"),
    (8, "--tensor-model-parallel-size 8 --micro-batch-size 1"),
    (8, "--pipeline-model-parallel-size 8 --micro-batch-size 1"),
    (8, "--micro-batch-size 1 --fp16 --bf16"),
]


def validate() -> None:
    from minitron.core.num_microbatches_calculator import get_num_microbatches
    from minitron.pretrain_gpt import ARGS_DEFAULTS
    from minitron.training.arguments import ArgumentError, parse_args, validate_args
    from minitron.training.global_vars import set_global_variables, unset_global_variables

    for world, flags in CASES:
        print(f"world {world}: {flags}")
        args = parse_args(argv=MODEL + flags.split())
        args.world_size, args.rank = world, 0   # as rank 0 of that world would see it
        try:
            validate_args(args, ARGS_DEFAULTS)
        except ArgumentError as error:
            print(f"  rejected: {error}\n")
            continue
        set_global_variables(args, build_tokenizer=False)
        print(f"  data-parallel size {args.data_parallel_size}, global batch {args.global_batch_size}, "
              f"micro-batches per step {get_num_microbatches()}, params {args.params_dtype}\n")
        unset_global_variables()


def rampup(start: int = 16, increment: int = 16, samples: int = 1000,
           global_batch: int = 64, micro: int = 2, dp: int = 4) -> None:
    from minitron.core.num_microbatches_calculator import RampupBatchsizeNumMicroBatchesCalculator

    print(f"--rampup-batch-size {start} {increment} {samples}  --global-batch-size {global_batch}  "
          f"--micro-batch-size {micro}  (data-parallel size {dp})\n")
    calc = RampupBatchsizeNumMicroBatchesCalculator(global_batch, micro, dp, False, 0, start, increment, samples)
    # Run the bookkeeping of train() with no model: one row per stretch of equal batch size.
    stretches = []                       # [first iteration, last iteration, first consumed, last consumed, batch, micro-batches]
    consumed, iteration = 0, 0
    while not stretches or stretches[-1][4] < global_batch:
        calc.update(consumed)            # train() does this at the top of every iteration
        batch = calc.get_current_global_batch_size()
        if stretches and stretches[-1][4] == batch:
            stretches[-1][1], stretches[-1][3] = iteration, consumed
        else:
            stretches.append([iteration, iteration, consumed, consumed, batch, calc.get()])
        consumed += batch                # ... and this after train_step
        iteration += 1
    print(f"{'iterations':>12}  {'consumed samples':>16}  {'global batch':>12}  {'micro-batches':>13}")
    for first, last, c0, c1, batch, micro_batches in stretches:
        its = f"{first}-{last}" if batch < global_batch else f"{first}-"
        seen = f"{c0}-{c1}" if batch < global_batch else f"{c0}-"
        print(f"{its:>12}  {seen:>16}  {batch:>12}  {micro_batches:>13}")


def step(schedule: str = "0:16 4K:32 16K:64", seq_length: int = 32, train_samples: int = 1000,
         micro: int = 2, dp: int = 4) -> None:
    from minitron.core.num_microbatches_calculator import step_schedule_stretches

    print(f'--step-batch-size-schedule "{schedule}"  --seq-length {seq_length}  --train-samples {train_samples}  '
          f"--micro-batch-size {micro}  (data-parallel size {dp})\n")
    stretches, consumed = step_schedule_stretches(micro, dp, schedule, seq_length, train_samples)
    print(f"{'iterations':>12}  {'consumed samples':>16}  {'global batch':>12}  {'micro-batches':>13}")
    iteration, seen = 0, 0
    for batch, n in stretches:
        its, samples = f"{iteration}-{iteration + n - 1}", f"{seen}-{seen + (n - 1) * batch}"
        print(f"{its:>12}  {samples:>16}  {batch:>12}  {batch // (micro * dp):>13}")
        iteration, seen = iteration + n, seen + n * batch
    print(f"\n{iteration} iterations, {consumed} samples consumed")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else "validate"
    if mode == "validate":
        validate()
    elif mode == "rampup":
        rampup()
    elif mode == "step":
        step()
    else:
        raise SystemExit(f"unknown mode {mode!r}: use validate, rampup or step")
