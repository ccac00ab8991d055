"""How many micro-batches make one global batch, now and during a batch-size ramp-up.

The batch arithmetic every rank agrees on::

    global_batch = micro_batch * data_parallel_size * num_micro_batches

Each data-parallel replica runs ``num_micro_batches`` forward/backward passes of
``micro_batch`` samples and accumulates gradients; one optimizer step then consumes a whole
global batch. Pipeline parallelism needs several micro-batches in flight to fill its stages,
which is why this number, not just the batch size, is a first-class quantity in Megatron.

Ramp-up (``--rampup-batch-size START INCREMENT SAMPLES``) grows the global batch from START in
steps of INCREMENT, spread evenly over the first SAMPLES training samples: small batches early,
when gradients are large and noisy, then the full batch.

Step schedule (``--step-batch-size-schedule "0:16 2M:32 5M:64"``, Megatron-Core 0.19's): the
global batch is a step function of the progress, each THRESHOLD:BATCH pair saying "from here
on, this batch". From the command line the thresholds count *tokens* (Megatron passes the
sequence length; K, M, B, T suffixes welcome) and become samples by integer division by it.
The largest step is the run's global batch.

The API is Megatron Core's. Ramp-up is core_v0.17's: 0.19 still parses --rampup-batch-size but
no longer passes it on (its calculator takes only step schedules); minitron keeps running it.
An inconsistent batch raises AssertionError, as Megatron's asserts do, so Megatron's own unit
tests of this module run against this one.
"""

from __future__ import annotations

from minitron.trace import traced

_GLOBAL_NUM_MICROBATCHES_CALCULATOR: "NumMicroBatchesCalculator | None" = None


def _check(condition: bool, message: str) -> None:
    # Megatron writes `assert`; raising the same type keeps its callers' and tests' contract,
    # and unlike `assert` it still checks under `python -O`.
    if not condition:
        raise AssertionError(message)


class NumMicroBatchesCalculator:
    """Shared state: the global batch asked for, the one actually run, and its micro-batches."""

    def __init__(self, global_batch_size: int, micro_batch_size: int, data_parallel_size: int,
                 decrease_batch_size_if_needed: bool, rank: int):
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.data_parallel_size = data_parallel_size
        self.decrease_batch_size_if_needed = decrease_batch_size_if_needed
        self.rank = rank
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.current_global_batch_size = global_batch_size
        self.current_running_global_batch_size = global_batch_size
        self.num_micro_batches = 0

    def get(self) -> int:
        return self.num_micro_batches

    def get_current_global_batch_size(self) -> int:
        return self.current_global_batch_size

    def get_micro_batch_size(self) -> int:
        return self.micro_batch_size

    def get_current_running_global_batch_size(self) -> int:
        """The batch actually run: the current one, or with --decrease-batch-size-if-needed
        the largest multiple of micro batch x dp below it."""
        return self.current_running_global_batch_size

    def update(self, consumed_samples: int, consistency_check: bool = True, verbose: bool = False) -> None:
        raise NotImplementedError

    def _set_from_current(self, consistency_check: bool) -> None:
        per_step = self.micro_batch_times_data_parallel_size
        batch = self.current_global_batch_size
        if self.decrease_batch_size_if_needed:
            batch -= batch % per_step  # run what divides; the batch asked for comes back if dp changes
        elif consistency_check:
            _check(batch % per_step == 0,
                   f"global batch size {batch} is not divisible by micro batch size "
                   f"{self.micro_batch_size} x data-parallel size {self.data_parallel_size}")
        self.current_running_global_batch_size = batch
        self.num_micro_batches = batch // per_step


class ConstantNumMicroBatchesCalculator(NumMicroBatchesCalculator):
    """The usual case: the same number of micro-batches every iteration."""

    def __init__(self, global_batch_size: int, micro_batch_size: int, data_parallel_size: int,
                 decrease_batch_size_if_needed: bool, rank: int):
        super().__init__(global_batch_size, micro_batch_size, data_parallel_size,
                         decrease_batch_size_if_needed, rank)
        self._set_from_current(consistency_check=True)
        _check(self.num_micro_batches >= 1,
               f"number of micro-batches must be at least 1, got {self.num_micro_batches}")

    def update(self, consumed_samples: int, consistency_check: bool = True, verbose: bool = False) -> None:
        pass  # constant: nothing changes with progress


class RampupBatchsizeNumMicroBatchesCalculator(NumMicroBatchesCalculator):
    """Global batch grows START -> global in INCREMENT steps over the first SAMPLES samples."""

    def __init__(self, global_batch_size: int, micro_batch_size: int, data_parallel_size: int,
                 decrease_batch_size_if_needed: bool, rank: int, start_global_batch_size: int,
                 batch_size_increment: int, ramup_samples: int):  # sic: Megatron's spelling
        super().__init__(global_batch_size, micro_batch_size, data_parallel_size,
                         decrease_batch_size_if_needed, rank)
        _check(start_global_batch_size > 0 and batch_size_increment > 0 and ramup_samples >= 0,
               "ramp-up needs START > 0, INCREMENT > 0 and SAMPLES >= 0")
        climb = global_batch_size - start_global_batch_size
        _check(climb >= 0 and climb % batch_size_increment == 0,
               f"the ramp cannot climb from {start_global_batch_size} to {global_batch_size} "
               f"in steps of {batch_size_increment}")
        self.start_global_batch_size = start_global_batch_size
        self.batch_size_increment = batch_size_increment
        self.ramup_samples = ramup_samples
        # Each increment lasts this many samples (a float, as in Megatron: where the steps fall
        # is part of the schedule a reader compares).
        self.rampup_samples_per_increment = ramup_samples / (climb // batch_size_increment)
        self.update(0, consistency_check=False)

    def update(self, consumed_samples: int, consistency_check: bool = True, verbose: bool = False) -> None:
        if consumed_samples > self.ramup_samples:
            self.current_global_batch_size = self.global_batch_size
        else:
            steps = int(consumed_samples / self.rampup_samples_per_increment)
            self.current_global_batch_size = self.start_global_batch_size + steps * self.batch_size_increment
        self._set_from_current(consistency_check)


class StepBatchsizeNumMicroBatchesCalculator(NumMicroBatchesCalculator):
    """The global batch of the last step whose threshold the consumed samples have reached."""

    _SUFFIXES = {"K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}

    def __init__(self, micro_batch_size: int, data_parallel_size: int, decrease_batch_size_if_needed: bool,
                 rank: int, schedule: str, seq_length: int | None = None):
        if decrease_batch_size_if_needed:
            raise ValueError("a step batch-size schedule cannot decrease its batches to fit (decrease_batch_size_if_needed)")
        self.seq_length = seq_length
        self.schedule = self._parse_schedule(schedule, seq_length)
        _check(self.schedule[0][0] == 0, f"the first step of the schedule must start at 0, got {self.schedule[0][0]} samples")
        for (before, _), (after, _) in zip(self.schedule, self.schedule[1:]):
            _check(after > before, f"schedule thresholds must be strictly increasing, got {before} before {after}")
        for _, batch in self.schedule:
            _check(batch > 0, f"batch size must be positive, got {batch}")
        # Divisibility by micro batch x dp is checked per step as training reaches it (update):
        # a run resumed on more ranks may have left behind steps the new layout cannot split.
        super().__init__(self.schedule[-1][1], micro_batch_size, data_parallel_size, False, rank)
        self.update(0, consistency_check=False)

    @classmethod
    def _parse_numeric_value(cls, text: str) -> int:
        text = text.strip().upper()
        scale = cls._SUFFIXES.get(text[-1:], 1)
        try:
            return int(float(text[:-1] if scale > 1 else text) * scale)
        except ValueError:
            raise ValueError(f'"{text}" is not a number (a number with a K, M, B or T suffix is)') from None

    @classmethod
    def _parse_schedule(cls, schedule: str, seq_length: int | None) -> list[tuple[int, int]]:
        """"THRESHOLD:BATCH ..." (spaces or commas between) -> [(threshold in samples, batch)], sorted."""
        steps = []
        for entry in schedule.replace(",", " ").split():
            if ":" not in entry:
                raise ValueError(f'invalid schedule entry "{entry}": expected THRESHOLD:BATCH_SIZE')
            threshold, batch = (cls._parse_numeric_value(part) for part in entry.split(":", 1))
            steps.append((threshold // seq_length if seq_length else threshold, batch))
        _check(len(steps) > 0, "schedule must have at least one entry")
        return sorted(steps)

    def _get_batch_size_for_samples(self, consumed_samples: int) -> int:
        return [batch for threshold, batch in self.schedule if consumed_samples >= threshold][-1]

    def update(self, consumed_samples: int, consistency_check: bool = True, verbose: bool = False) -> None:
        self.current_global_batch_size = self._get_batch_size_for_samples(consumed_samples)
        self._set_from_current(consistency_check)


@traced
def _build_num_microbatches_calculator(rank: int, rampup_batch_size: list[int] | None, global_batch_size: int,
                                       micro_batch_size: int, data_parallel_size: int,
                                       decrease_batch_size_if_needed: bool = False,
                                       step_batch_size_schedule: str | None = None,
                                       seq_length: int | None = None) -> NumMicroBatchesCalculator:
    """A calculator for these sizes, not installed anywhere (validate_args walks a ramp with one)."""
    if step_batch_size_schedule is not None:
        return StepBatchsizeNumMicroBatchesCalculator(micro_batch_size, data_parallel_size,
                                                      decrease_batch_size_if_needed, rank,
                                                      step_batch_size_schedule, seq_length)
    if rampup_batch_size is None:
        return ConstantNumMicroBatchesCalculator(global_batch_size, micro_batch_size, data_parallel_size,
                                                 decrease_batch_size_if_needed, rank)
    _check(len(rampup_batch_size) == 3, "--rampup-batch-size takes START INCREMENT SAMPLES")
    start, increment, samples = (int(v) for v in rampup_batch_size)
    return RampupBatchsizeNumMicroBatchesCalculator(global_batch_size, micro_batch_size, data_parallel_size,
                                                    decrease_batch_size_if_needed, rank, start, increment, samples)


@traced
def init_num_microbatches_calculator(rank: int, rampup_batch_size: list[int] | None, global_batch_size: int,
                                     micro_batch_size: int, data_parallel_size: int,
                                     decrease_batch_size_if_needed: bool = False, step_batch_size_schedule: str | None = None,
                                     seq_length: int | None = None) -> None:
    """Install the process-wide calculator (set_global_variables, once per run)."""
    global _GLOBAL_NUM_MICROBATCHES_CALCULATOR
    _check(_GLOBAL_NUM_MICROBATCHES_CALCULATOR is None, "num microbatches calculator is already initialized")
    _GLOBAL_NUM_MICROBATCHES_CALCULATOR = _build_num_microbatches_calculator(
        rank, rampup_batch_size, global_batch_size, micro_batch_size, data_parallel_size,
        decrease_batch_size_if_needed, step_batch_size_schedule, seq_length)


def reconfigure_num_microbatches_calculator(rank: int, rampup_batch_size: list[int] | None, global_batch_size: int,
                                            micro_batch_size: int, data_parallel_size: int,
                                            decrease_batch_size_if_needed: bool = False,
                                            step_batch_size_schedule: str | None = None,
                                            seq_length: int | None = None) -> None:
    """Replace the installed calculator (Megatron's tools use it to change sizes mid-process)."""
    global _GLOBAL_NUM_MICROBATCHES_CALCULATOR
    _GLOBAL_NUM_MICROBATCHES_CALCULATOR = _build_num_microbatches_calculator(
        rank, rampup_batch_size, global_batch_size, micro_batch_size, data_parallel_size,
        decrease_batch_size_if_needed, step_batch_size_schedule, seq_length)


def destroy_num_microbatches_calculator() -> None:
    global _GLOBAL_NUM_MICROBATCHES_CALCULATOR
    _GLOBAL_NUM_MICROBATCHES_CALCULATOR = None


unset_num_microbatches_calculator = destroy_num_microbatches_calculator  # Megatron has both names


def get_num_microbatches() -> int:
    return _GLOBAL_NUM_MICROBATCHES_CALCULATOR.get()


def get_current_global_batch_size() -> int:
    return _GLOBAL_NUM_MICROBATCHES_CALCULATOR.get_current_global_batch_size()


def get_current_running_global_batch_size() -> int:
    return _GLOBAL_NUM_MICROBATCHES_CALCULATOR.get_current_running_global_batch_size()


def get_micro_batch_size() -> int:
    return _GLOBAL_NUM_MICROBATCHES_CALCULATOR.get_micro_batch_size()


def update_num_microbatches(consumed_samples: int, consistency_check: bool = True, verbose: bool = False) -> None:
    """Called once per iteration by train(): moves the ramp-up along."""
    _GLOBAL_NUM_MICROBATCHES_CALCULATOR.update(consumed_samples, consistency_check, verbose)


def rampup_stretches(global_batch_size: int, micro_batch_size: int, data_parallel_size: int,
                     rampup_batch_size: list[int], limit: int, rank: int = 0) -> tuple[list[tuple[int, int]], int]:
    """[(global batch, iterations)] while the consumed samples at an iteration's start stay
    <= limit, and the samples consumed then: train()'s ramp-up without a model, so that
    validate_args can check every batch of the ramp (and count --train-samples' iterations)
    before any rank starts."""
    calc = RampupBatchsizeNumMicroBatchesCalculator(global_batch_size, micro_batch_size, data_parallel_size,
                                                    False, rank, *rampup_batch_size)

    def batch_at(consumed: int) -> int:
        calc.update(consumed, consistency_check=False)
        return calc.get_current_global_batch_size()

    stretches, consumed = [], 0
    while consumed <= limit:
        batch = batch_at(consumed)
        # The batch only grows with consumed samples, so the end of a stretch of equal batches
        # is found by bisection: n iterations of `batch` each, until it changes or passes limit.
        lo, hi = 1, (limit - consumed) // batch + 1
        while lo < hi:
            n = (lo + hi) // 2
            lo, hi = (lo, n) if batch_at(consumed + n * batch) != batch else (n + 1, hi)
        stretches.append((batch, lo))
        consumed += lo * batch
    return stretches, consumed


def step_schedule_stretches(micro_batch_size: int, data_parallel_size: int, schedule: str, seq_length: int,
                            train_samples: int) -> tuple[list[tuple[int, int]], int]:
    """[(global batch, iterations)] of a step schedule, iterating as Megatron's update_train_iters
    does (while fewer than ``train_samples`` are consumed, so a last batch may run past them),
    and the samples consumed then. Each stretch ends at the first iteration that starts at or
    past the next threshold: the batch is chosen at an iteration's start."""
    calc = StepBatchsizeNumMicroBatchesCalculator(micro_batch_size, data_parallel_size, False, 0, schedule, seq_length)
    stretches, consumed = [], 0
    while consumed < train_samples:
        batch = calc._get_batch_size_for_samples(consumed)
        following = [threshold for threshold, _ in calc.schedule if threshold > consumed]
        end = min(following[0], train_samples) if following else train_samples
        n = -(-(end - consumed) // batch)   # ceil: the iterations that start before `end`
        stretches.append((batch, n))
        consumed += n * batch
    return stretches, consumed
