"""validate_args for the schedules: how big each global batch is, how long the run is, and how
the learning rate moves over it.

Megatron counts a run either in iterations (--train-iters, the --lr-*-iters flags) or in
samples (--train-samples, the --lr-*-samples flags), never a mix: the scheduler counts samples
either way (an iteration is a global batch of them), but a flag in the other unit would be
converted with a batch size that a ramp-up or a step schedule changes during the run. The
batch-size schedules (--rampup-batch-size, --step-batch-size-schedule) therefore need
--train-samples, and each batch they reach is checked here, before any rank starts, by walking
the schedule as train() will.
"""

from __future__ import annotations

from minitron.core.num_microbatches_calculator import (StepBatchsizeNumMicroBatchesCalculator, rampup_stretches,
                                                       step_schedule_stretches)
from minitron.core.pipeline_parallel.pp_rank_microbatches import check_microbatch_group_size
from minitron.training.argument_groups import ArgumentError, require

_MAX_RAMP_STEPS = 100_000  # Megatron's own examples climb in about a hundred


def _given(args, unit: str) -> list[str]:
    """The learning-rate flags counted in ``unit`` (iters or samples) that the command line set."""
    given = [f"--lr-decay-{unit}"] if getattr(args, f"lr_decay_{unit}") is not None else []
    given += [f"--lr-wsd-decay-{unit}"] if getattr(args, f"lr_wsd_decay_{unit}") is not None else []
    return given + ([f"--lr-warmup-{unit}"] if getattr(args, f"lr_warmup_{unit}") else [])


def validate_batch(args) -> None:
    """The global batch (or each one a schedule reaches) splits into micro-batches x dp."""
    micro, dp = args.micro_batch_size, args.data_parallel_size
    per_step = micro * dp
    if args.step_batch_size_schedule is not None:
        _validate_step_schedule(args, per_step)
        return
    if args.global_batch_size is None:
        args.global_batch_size = per_step
    if args.rampup_batch_size is None:
        require(args.global_batch_size % per_step == 0,
                f"--global-batch-size {args.global_batch_size} is not a multiple of micro batch x "
                f"data-parallel size = {micro} x {dp} = {per_step}")
        return
    start, increment, samples = args.rampup_batch_size
    # Megatron divides by SAMPLES and by the number of steps: zero of either is a crash there.
    require(start >= 1 and increment >= 1 and samples >= 1,
            "--rampup-batch-size needs START >= 1, INCREMENT >= 1 and SAMPLES >= 1")
    require(args.global_batch_size > start and (args.global_batch_size - start) % increment == 0,
            f"--rampup-batch-size must climb from {start} to --global-batch-size "
            f"{args.global_batch_size} in whole steps of {increment}")
    steps = (args.global_batch_size - start) // increment
    require(steps <= _MAX_RAMP_STEPS, f"--rampup-batch-size climbs in {steps} steps; minitron walks the "
            f"ramp before launch and takes at most {_MAX_RAMP_STEPS}: use a larger INCREMENT")
    # Megatron checks each batch of the ramp when training reaches it; we walk the ramp the way
    # train() will (the same calculator, the same consumed samples), so a batch that would not
    # split into micro-batches fails now, and sizes the ramp skips over are no obstacle.
    limit = min(samples, args.train_samples) if args.train_samples else samples
    reached = [batch for batch, _ in _ramp(args, limit)[0]] + [args.global_batch_size]
    _require_splittable(args, reached, per_step, "the ramp-up")


def _validate_step_schedule(args, per_step: int) -> None:
    flag = "--step-batch-size-schedule"
    require(args.global_batch_size is None, f"{flag} sets every global batch: drop --global-batch-size "
            "(Megatron: cannot specify both)")
    require(args.rampup_batch_size is None, f"{flag} and --rampup-batch-size are two batch-size schedules: "
            "choose one (Megatron 0.19 ignores --rampup-batch-size)")
    require(args.train_samples is not None, f"{flag} counts samples: train with --train-samples N instead "
            "of --train-iters")
    try:
        calc = StepBatchsizeNumMicroBatchesCalculator(args.micro_batch_size, args.data_parallel_size, False,
                                                      args.rank, args.step_batch_size_schedule, args.seq_length)
    except (ValueError, AssertionError) as exc:   # the calculator's own words, e.g. "must start at 0"
        raise ArgumentError(f"{flag} {args.step_batch_size_schedule!r}: {exc} (thresholds count tokens; "
                            "e.g. \"0:16 1M:32\")") from None
    # The run's global batch is the schedule's last (the calculator's global_batch_size):
    # what the data, the log and the checkpoint size themselves by.
    args.global_batch_size = calc.global_batch_size
    stretches, _ = _step_schedule(args)
    _require_splittable(args, [batch for batch, _ in stretches], per_step, f"{flag}")


def _require_splittable(args, batches, per_step: int, what: str) -> None:
    micro, dp, pp = args.micro_batch_size, args.data_parallel_size, args.pipeline_model_parallel_size
    for batch in batches:
        require(batch % per_step == 0,
                f"{what} reaches a global batch of {batch}, not a multiple of micro batch x "
                f"data-parallel size = {micro} x {dp} = {per_step}; choose the sizes so every batch of it is")
        # The interleaved schedule's group-size rules, for every batch and not only the last one.
        if args.virtual_pipeline_model_parallel_size is not None:
            problem = check_microbatch_group_size(batch // per_step, pp, args.microbatch_group_size_per_vp_stage or pp)
            require(problem is None, f"{what} reaches a global batch of {batch}, {batch // per_step} "
                    f"micro-batches: {problem}")


def _ramp(args, limit: int):
    return rampup_stretches(args.global_batch_size, args.micro_batch_size, args.data_parallel_size,
                            args.rampup_batch_size, limit, rank=args.rank)


def _step_schedule(args):
    return step_schedule_stretches(args.micro_batch_size, args.data_parallel_size, args.step_batch_size_schedule,
                                   args.seq_length, args.train_samples)


def train_iters_from_samples(args) -> int:
    """Megatron's update_train_iters: the iterations that consume --train-samples. A constant
    batch or a ramp-up drops a last, partial global batch; a step schedule (Megatron 0.19's
    loop) runs iterations while fewer than --train-samples are consumed, so its last may pass them."""
    if args.step_batch_size_schedule is not None:
        return sum(n for _, n in _step_schedule(args)[0])
    if args.rampup_batch_size is None:
        return args.train_samples // args.global_batch_size
    stretches, consumed = _ramp(args, min(args.rampup_batch_size[2], args.train_samples))
    iterations = sum(n for _, n in stretches)
    return iterations + max(args.train_samples - consumed, 0) // args.global_batch_size


def validate_run_length(args) -> None:
    """--train-iters or --train-samples, and the lr flags counted in the same unit."""
    if args.train_iters and args.train_samples:
        raise ArgumentError("give --train-iters or --train-samples, not both")
    if args.train_iters:
        require(args.rampup_batch_size is None,
                "--rampup-batch-size counts samples: train with --train-samples N instead of --train-iters "
                "(Megatron: expected no batch-size rampup for iteration-based training)")
        for flag in _given(args, "samples"):
            raise ArgumentError(f"{flag} counts samples but --train-iters counts iterations: use the "
                                "--lr-*-iters flag (Megatron: expected iteration-based learning rate schedule)")
    if args.train_samples:
        for flag in _given(args, "iters"):
            raise ArgumentError(f"{flag} counts iterations but --train-samples counts samples: use the "
                                "--lr-*-samples flag (or --lr-warmup-fraction)")
        args.train_iters = train_iters_from_samples(args)
        require(args.train_iters >= 1, f"--train-samples {args.train_samples} is less than one global "
                f"batch ({args.global_batch_size})")


def validate_lr_schedule(args) -> None:
    """What OptimizerParamScheduler asserts, said once here rather than by every rank."""
    require(args.lr is not None, "--lr is required for training (e.g. --lr 1e-3)")
    require(args.min_lr <= args.lr, f"--min-lr {args.min_lr:g} is above --lr {args.lr:g}")
    require(args.lr_warmup_init <= args.lr, f"--lr-warmup-init {args.lr_warmup_init:g} is above --lr {args.lr:g}: "
            "warm-up climbs from it to --lr")
    if args.lr_warmup_fraction is not None:
        other = "--lr-warmup-iters" if args.lr_warmup_iters else "--lr-warmup-samples" if args.lr_warmup_samples else None
        require(other is None, f"give --lr-warmup-fraction or {other}, not both")
        require(args.lr_warmup_fraction < 1, "--lr-warmup-fraction 1 leaves no step to decay over: give less than 1")
    samples = bool(args.train_samples)
    decay = (args.lr_decay_samples or args.train_samples) if samples else (args.lr_decay_iters or args.train_iters)
    unit, warmup = ("samples", args.lr_warmup_samples) if samples else ("iterations", args.lr_warmup_iters)
    kind = "samples" if samples else "iters"
    require(warmup < decay, f"--lr-warmup-{kind} {warmup} leaves nothing of the {decay} {unit} the learning rate "
            f"decays over (--lr-decay-{kind}, default --train-{kind}): warm up for fewer")
    wsd = args.lr_wsd_decay_samples if samples else args.lr_wsd_decay_iters
    if args.lr_decay_style == "WSD":
        require(wsd is not None, f"--lr-decay-style WSD anneals over its last --lr-wsd-decay-{kind} N: give it")
        require(wsd <= decay, f"--lr-wsd-decay-{kind} {wsd} is longer than the {decay} {unit} the learning rate "
                f"decays over: give at most {decay}")
    else:
        require(wsd is None, f"--lr-wsd-decay-{kind} is read only with --lr-decay-style WSD: drop it or add that")
    if args.decoupled_lr is None:
        require(args.decoupled_min_lr is None, "--decoupled-min-lr is the floor of --decoupled-lr: give "
                "--decoupled-lr too, or drop it")
    else:
        floor = args.decoupled_min_lr if args.decoupled_min_lr is not None else args.min_lr
        require(floor <= args.decoupled_lr, f"the embedding's learning rate would decay from --decoupled-lr "
                f"{args.decoupled_lr:g} up to {floor:g}: give a --decoupled-min-lr at most --decoupled-lr")
