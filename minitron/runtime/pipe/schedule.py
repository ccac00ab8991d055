"""DeepSpeed's pipeline schedules (``deepspeed/runtime/pipe/schedule.py``): a batch as a stream of
instructions, one list per step.

Megatron's 1F1B (core/pipeline_parallel/schedules.py) is a loop that calls forward, send, recv and
backward as it goes. DeepSpeed writes the same pattern down first, as data: ``steps()`` yields,
for one stage, a list of instructions per step, and the engine (engine.py) executes them in order.
Every stage walks the same number of steps, ``2 * (micro_batches + stages - 1)``; each step is
either a forward step or a backward step for this stage, and stages of even and odd parity take
turns (stage s runs forwards on steps of its own parity), so that whenever stage s sends, stage
s + 1 is in a step in which it receives: the pairing that keeps blocking sends from deadlocking.
Because every step is a unit that no stage leaves half-done, a barrier could sit between any two
steps: that is what makes the stream drawable as a grid of steps (``minitron view``).

Buffers: a stage keeps the activations of every forward it has not yet run backward for. At
stage s that is at most ``stages - s`` micro-batches (the last stage runs each backward right
after its forward), so ``num_pipe_buffers`` is that, at least 2, and micro-batch m lives in
buffer ``m % num_pipe_buffers``. Megatron keeps the same number of activations alive, but in
lists it appends to and pops from, not in numbered slots.
"""

from __future__ import annotations


class PipeInstruction:
    """One instruction; its keyword arguments become attributes (DeepSpeed's namedtuple-like
    base). Two instructions are equal when their names and arguments are, so streams compare."""

    def __init__(self, **kwargs):
        self.name = type(self).__name__
        self.kwargs = kwargs
        for key, value in kwargs.items():
            setattr(self, key, value)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.kwargs.items())
        return f"{self.name}({inner})"

    def __eq__(self, other) -> bool:
        return isinstance(other, PipeInstruction) and (self.name, self.kwargs) == (other.name, other.kwargs)

    __hash__ = None   # mutable-looking value objects: compare, do not hash


class OptimizerStep(PipeInstruction):
    """Step the optimizer (and zero the gradients): after ReduceTiedGrads and ReduceGrads."""


class ReduceGrads(PipeInstruction):
    """Reduce the stage's gradients over its data-parallel group."""


class ReduceTiedGrads(PipeInstruction):
    """All-reduce the gradients of tied weights (the embedding and the output head) over the
    stages that hold a copy: each copy saw only its own stage's use of the weight."""


class BufferOpInstruction(PipeInstruction):
    """An instruction on one pipeline buffer slot."""

    def __init__(self, buffer_id: int, **kwargs):
        super().__init__(buffer_id=buffer_id, **kwargs)


class LoadMicroBatch(BufferOpInstruction):
    """First stage: the micro-batch's inputs into the buffer; last stage: its labels."""


class ForwardPass(BufferOpInstruction):
    """The stage's layers on the buffer's inputs; the last stage also computes the loss."""


class BackwardPass(BufferOpInstruction):
    """Backward from the buffer's outputs (the last stage: from the loss) with the received
    gradient; the gradients accumulate in the parameters' ``.grad``."""


class SendActivation(BufferOpInstruction):
    """The buffer's outputs to the next stage (blocking; paired with its RecvActivation)."""


class RecvActivation(BufferOpInstruction):
    """The previous stage's outputs into the buffer's inputs (blocking)."""


class SendGrad(BufferOpInstruction):
    """The gradient of the buffer's inputs to the previous stage (blocking)."""


class RecvGrad(BufferOpInstruction):
    """The gradient of the buffer's outputs from the next stage (blocking)."""


def _is_even(x: int) -> bool:
    return x % 2 == 0


class PipeSchedule:
    """What every schedule shares: the stage it runs on and the buffer mapping. Iterating a
    schedule yields its steps (lists of instructions)."""

    def __init__(self, micro_batches: int, stages: int, stage_id: int):
        self.micro_batches, self.stages, self.stage_id = micro_batches, stages, stage_id
        self.prev_stage, self.next_stage = stage_id - 1, stage_id + 1

    def steps(self):
        raise NotImplementedError

    def num_pipe_buffers(self) -> int:
        return self.micro_batches

    def _valid_micro_batch(self, micro_batch_id: int) -> bool:
        return 0 <= micro_batch_id < self.micro_batches

    def _valid_stage(self, stage_id: int) -> bool:
        return 0 <= stage_id < self.stages

    @property
    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    @property
    def is_last_stage(self) -> bool:
        return self.stage_id == self.stages - 1

    def _buffer_idx(self, micro_batch_id: int) -> int:
        """Buffers are used round-robin: micro-batch m in slot m mod the number of slots."""
        assert self._valid_micro_batch(micro_batch_id)
        return micro_batch_id % self.num_pipe_buffers()

    def __iter__(self):
        return iter(self.steps())


class InferenceSchedule(PipeSchedule):
    """Forward only: ``micro_batches + stages - 1`` steps. Two buffers suffice, one being
    received into while the other is sent from; even and odd stages swap which is which, and
    swap the order of their send and receive, so that neighbours always pair up."""

    def steps(self):
        for step_id in range(self.micro_batches + self.stages - 1):
            cmds = []
            micro_batch_id = step_id - self.stage_id   # stage s starts s steps late
            even = _is_even(self.stage_id)
            recv_buf = step_id % 2 if even else (step_id + 1) % 2
            send_buf = (step_id + 1) % 2 if even else step_id % 2
            if (self.is_first_stage or self.is_last_stage) and self._valid_micro_batch(micro_batch_id):
                cmds.append(LoadMicroBatch(recv_buf))
            send = [SendActivation(send_buf)] if (
                self._valid_stage(self.next_stage) and self._valid_micro_batch(micro_batch_id - 1)) else []
            recv = [RecvActivation(recv_buf)] if (
                self._valid_stage(self.prev_stage) and self._valid_micro_batch(micro_batch_id)) else []
            cmds += send + recv if even else recv + send
            if self._valid_micro_batch(micro_batch_id):
                cmds.append(ForwardPass(recv_buf))
            yield cmds

    def num_pipe_buffers(self) -> int:
        return 2


# --8<-- [start:train-schedule]
class TrainSchedule(PipeSchedule):
    """Synchronous 1F1B as a stream: forward and backward steps alternate on every stage once
    the pipeline is full; the last step also reduces and steps the optimizer."""

    def steps(self):
        total_steps = 2 * (self.micro_batches + self.stages - 1)
        prev_micro_batch_id = -1
        for step_id in range(total_steps):
            micro_batch_id, is_forward = self._step_to_micro_batch(step_id)
            cmds = []
            # The previous step's result leaves now, while this step's input arrives: on a
            # forward step the previous (backward) step's input gradient goes upstream, on a
            # backward step the previous (forward) step's activation goes downstream.
            prev_valid, curr_valid = self._valid_micro_batch(prev_micro_batch_id), self._valid_micro_batch(micro_batch_id)
            if is_forward:
                if prev_valid and self._valid_stage(self.prev_stage):
                    cmds.append(SendGrad(self._buffer_idx(prev_micro_batch_id)))
                if curr_valid and self._valid_stage(self.prev_stage):
                    cmds.append(RecvActivation(self._buffer_idx(micro_batch_id)))
            else:
                if curr_valid and self._valid_stage(self.next_stage):
                    cmds.append(RecvGrad(self._buffer_idx(micro_batch_id)))
                if prev_valid and self._valid_stage(self.next_stage):
                    cmds.append(SendActivation(self._buffer_idx(prev_micro_batch_id)))
            if (self.is_first_stage or self.is_last_stage) and is_forward and curr_valid:
                cmds.append(LoadMicroBatch(self._buffer_idx(micro_batch_id)))
            if curr_valid:
                buffer_id = self._buffer_idx(micro_batch_id)
                cmds.append(ForwardPass(buffer_id) if is_forward else BackwardPass(buffer_id))
            if step_id == total_steps - 1:
                cmds += [ReduceTiedGrads(), ReduceGrads(), OptimizerStep()]
            prev_micro_batch_id = micro_batch_id
            yield cmds

    def num_pipe_buffers(self) -> int:
        """The most forwards in flight at this stage: ``stages - stage_id`` (the last stage one),
        no more than there are micro-batches, and never fewer than 2."""
        return max(2, min(self.stages - self.stage_id, self.micro_batches))
    # --8<-- [end:train-schedule]

    def _step_to_micro_batch(self, step_id: int) -> tuple[int, bool]:
        """(micro-batch, is_forward) of ``step_id`` on this stage; the micro-batch may be out
        of range (a step in the ramp-up or drain where this stage has nothing to do).

        A stage runs forwards on steps of its own parity. Stage s gets micro-batch m's
        activation one step after stage s - 1 computed it, so its forwards lag by s // 2 pairs
        of steps; its backwards trail the last stage's by the way back, stages - 1 - s steps."""
        forward = _is_even(step_id) == _is_even(self.stage_id)
        base = step_id // 2   # for odd steps the same as (step_id - 1) // 2
        if forward:
            return base - self.stage_id // 2, True
        if _is_even(step_id):   # odd stage, backward
            return base - self.stages + (self.stage_id + 1) // 2, False
        return base - self.stages + 1 + self.stage_id // 2, False   # even stage, backward
