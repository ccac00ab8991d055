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
"""

from __future__ import annotations

_GLOBAL_NUM_MICROBATCHES_CALCULATOR: "NumMicroBatchesCalculator | None" = None


class NumMicroBatchesCalculator:
    """Shared state: the current global batch and how many micro-batches it takes."""

    def __init__(self, global_batch_size: int, micro_batch_size: int, data_parallel_size: int):
        self.global_batch_size = global_batch_size
        self.micro_batch_size = micro_batch_size
        self.data_parallel_size = data_parallel_size
        self.micro_batch_times_data_parallel_size = micro_batch_size * data_parallel_size
        self.current_global_batch_size = global_batch_size
        self.num_micro_batches = 0

    def get(self) -> int:
        return self.num_micro_batches

    def get_current_global_batch_size(self) -> int:
        return self.current_global_batch_size

    def update(self, consumed_samples: int, consistency_check: bool = True) -> None:
        raise NotImplementedError

    def _set_from_current(self, consistency_check: bool) -> None:
        per_step = self.micro_batch_times_data_parallel_size
        if consistency_check and self.current_global_batch_size % per_step:
            raise ValueError(
                f"global batch size {self.current_global_batch_size} is not divisible by "
                f"micro batch size {self.micro_batch_size} x data-parallel size {self.data_parallel_size}"
            )
        self.num_micro_batches = self.current_global_batch_size // per_step


class ConstantNumMicroBatchesCalculator(NumMicroBatchesCalculator):
    """The usual case: the same number of micro-batches every iteration."""

    def __init__(self, global_batch_size: int, micro_batch_size: int, data_parallel_size: int):
        super().__init__(global_batch_size, micro_batch_size, data_parallel_size)
        self._set_from_current(consistency_check=True)
        if self.num_micro_batches < 1:
            raise ValueError(f"number of micro-batches must be at least 1, got {self.num_micro_batches}")

    def update(self, consumed_samples: int, consistency_check: bool = True) -> None:
        pass  # constant: nothing changes with progress


class RampupBatchsizeNumMicroBatchesCalculator(NumMicroBatchesCalculator):
    """Global batch grows START -> global in INCREMENT steps over the first SAMPLES samples."""

    def __init__(self, global_batch_size: int, micro_batch_size: int, data_parallel_size: int,
                 start_global_batch_size: int, batch_size_increment: int, ramup_samples: int):
        super().__init__(global_batch_size, micro_batch_size, data_parallel_size)
        self.start_global_batch_size = start_global_batch_size
        self.batch_size_increment = batch_size_increment
        self.ramup_samples = ramup_samples
        num_increments = (global_batch_size - start_global_batch_size) // batch_size_increment
        # validate_args guarantees num_increments >= 1, so this division is safe.
        self.rampup_samples_per_increment = ramup_samples / num_increments
        self.update(0, consistency_check=False)

    def update(self, consumed_samples: int, consistency_check: bool = True) -> None:
        if consumed_samples > self.ramup_samples:
            self.current_global_batch_size = self.global_batch_size
        else:
            steps = int(consumed_samples / self.rampup_samples_per_increment)
            self.current_global_batch_size = self.start_global_batch_size + steps * self.batch_size_increment
        self._set_from_current(consistency_check)


def init_num_microbatches_calculator(rank: int, rampup_batch_size: list[int] | None, global_batch_size: int,
                                     micro_batch_size: int, data_parallel_size: int) -> None:
    """Build the process-wide calculator (set_global_variables calls this once per run)."""
    global _GLOBAL_NUM_MICROBATCHES_CALCULATOR
    if rampup_batch_size is None:
        calc = ConstantNumMicroBatchesCalculator(global_batch_size, micro_batch_size, data_parallel_size)
    else:
        start, increment, samples = (int(v) for v in rampup_batch_size)
        calc = RampupBatchsizeNumMicroBatchesCalculator(
            global_batch_size, micro_batch_size, data_parallel_size, start, increment, samples)
    _GLOBAL_NUM_MICROBATCHES_CALCULATOR = calc


def destroy_num_microbatches_calculator() -> None:
    global _GLOBAL_NUM_MICROBATCHES_CALCULATOR
    _GLOBAL_NUM_MICROBATCHES_CALCULATOR = None


def get_num_microbatches() -> int:
    return _GLOBAL_NUM_MICROBATCHES_CALCULATOR.get()


def get_current_global_batch_size() -> int:
    return _GLOBAL_NUM_MICROBATCHES_CALCULATOR.get_current_global_batch_size()


def get_micro_batch_size() -> int:
    return _GLOBAL_NUM_MICROBATCHES_CALCULATOR.micro_batch_size


def update_num_microbatches(consumed_samples: int, consistency_check: bool = True) -> None:
    """Called once per iteration by train(): moves the ramp-up along."""
    _GLOBAL_NUM_MICROBATCHES_CALCULATOR.update(consumed_samples, consistency_check)
