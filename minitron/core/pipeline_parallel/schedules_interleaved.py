"""The interleaved 1F1B schedule (Megatron's forward_backward_pipelining_with_interleaving).

With a virtual pipeline of size v, each pipeline rank holds v model chunks instead of one
contiguous block of layers: with 4 ranks and 16 layers in chunks of 2, rank 0 holds layers
1-2 and 9-10, rank 1 holds 3-4 and 11-12, and so on. A micro-batch goes round the ring of
ranks v times. The stages are v times shorter, so the pipeline fills and drains v times
faster: the bubble shrinks by a factor v, paid for with v times more point-to-point traffic.

Megatron keeps this in schedules.py, as one function with its helpers nested inside. Here it
has a file of its own, and the helpers, under Megatron's names, are the methods of one run
of the schedule: the bookkeeping (which chunk a step belongs to, who sends to whom) reads
best in pieces a reader can hold one at a time.

Megatron's vocabulary, used throughout: ``microbatch_id`` counts the global batch's
micro-batches (0 .. num_microbatches-1); ``model_chunk_id`` the chunks (0 .. v-1); a
``virtual_microbatch_id`` counts (micro-batch, chunk) pairs, the steps of the schedule
(0 .. num_microbatches * v - 1). Which pair a step runs is read off Megatron's schedule table
(pp_rank_microbatches.get_schedule_table): micro-batches cross the chunks in groups of
``microbatch_group_size_per_vp_stage`` (default pp), the last group taking what is left, so
the number of micro-batches need not be a multiple of pp.
"""

from __future__ import annotations

import torch

from minitron.accelerator import get_accelerator
from minitron.core import parallel_state as mpu
from minitron.core.pipeline_parallel import p2p_communication as p2p
from minitron.core.pipeline_parallel.pp_rank_microbatches import (
    check_microbatch_group_size, get_pp_rank_microbatches, get_schedule_table,
)
from minitron.core.pipeline_parallel.schedules import (
    _finalize, backward_step, deallocate_output_tensor, forward_step, get_model_config, get_tensor_shape,
)
from minitron.trace import traced


class _InterleavedSchedule:
    """One call of the interleaved schedule: its sizes, its queues, its steps."""

    def __init__(self, forward_step_func, data_iterator, model, num_microbatches: int, seq_length: int,
                 micro_batch_size: int, forward_only: bool):
        self.forward_step_func, self.model, self.forward_only = forward_step_func, model, forward_only
        self.num_microbatches = num_microbatches
        self.num_model_chunks = len(model)
        self.pp = mpu.get_pipeline_model_parallel_world_size()
        self.pp_rank = mpu.get_pipeline_model_parallel_rank()
        self.config = get_model_config(model[0])
        # validate_args refuses a bad size before any rank starts; this guards direct callers.
        self.group_size = getattr(self.config, "microbatch_group_size_per_vp_stage", None) or self.pp
        problem = check_microbatch_group_size(num_microbatches, self.pp, self.group_size)
        if problem:
            raise ValueError(problem)
        self.microbatch_id_table, self.model_chunk_id_table = zip(
            *get_schedule_table(num_microbatches, self.num_model_chunks, self.group_size))
        if not isinstance(data_iterator, list):
            data_iterator = [data_iterator] * self.num_model_chunks  # get_batch decides per chunk whether to read
        self.data_iterator = data_iterator
        self.tensor_shape = get_tensor_shape(self.config, seq_length, micro_batch_size)
        self.dealloc = getattr(self.config, "deallocate_pipeline_outputs", True)
        # Per chunk, the activations received (inputs), produced (outputs) and the gradients
        # received for those outputs, each waiting for its backward in arrival order.
        self.input_tensors = [[] for _ in model]
        self.output_tensors = [[] for _ in model]
        self.output_tensor_grads = [[] for _ in model]
        self.forward_data_store = []
        self.total_num_tokens = torch.zeros([], dtype=torch.int,   # loss tokens, for per-token loss
                                            device=get_accelerator().current_device_name())
        self.no_sync_context = None
        self._count_warmup()

    def _count_warmup(self) -> None:
        """How many forwards run before the first backward: enough that the first backward finds
        its gradient waiting. A later stage needs fewer (2 per stage, as Megatron counts).
        A rank runs (v - 1) groups of micro-batches before its last chunk sees its first one."""
        (self.total_num_microbatches, self.are_all_microbatches_in_warmup, self.num_warmup_microbatches,
         self.num_microbatches_remaining) = get_pp_rank_microbatches(
            self.num_microbatches, self.num_model_chunks, self.group_size, self.forward_only,
            pipeline_parallel_size=self.pp, pipeline_parallel_rank=self.pp_rank,
            virtual_pipeline_parallel_size=self.num_model_chunks)

    # Where a step belongs. ---------------------------------------------------------------
    def get_model_chunk_id(self, virtual_microbatch_id: int, forward: bool) -> int:
        """The table's chunk; backward walks the same order with the chunks reversed."""
        chunk = self.model_chunk_id_table[virtual_microbatch_id % self.total_num_microbatches]
        return chunk if forward else self.num_model_chunks - chunk - 1

    def get_microbatch_id_in_model_chunk(self, virtual_microbatch_id: int) -> int:
        return self.microbatch_id_table[virtual_microbatch_id]

    def num_released_microbatches(self, virtual_microbatch_id: int, chunk: int) -> int:
        """How many inputs of ``chunk`` were popped before step ``virtual_microbatch_id``: after
        its forward when forward-only, else after its backward (none during warm-up)."""
        table = self.model_chunk_id_table
        if self.forward_only:
            return table[:virtual_microbatch_id].count(chunk)
        if virtual_microbatch_id < self.num_warmup_microbatches:
            return 0
        backward_id = virtual_microbatch_id - self.num_warmup_microbatches
        return table[:backward_id].count(self.num_model_chunks - chunk - 1)

    def is_first_stage(self, model_chunk_id: int) -> bool:
        return mpu.is_pipeline_first_stage(ignore_virtual=False, vp_stage=model_chunk_id)

    def is_last_stage(self, model_chunk_id: int) -> bool:
        return mpu.is_pipeline_last_stage(ignore_virtual=False, vp_stage=model_chunk_id)

    def recv_tensor_from_previous_stage(self, virtual_microbatch_id: int, forward: bool):
        """(will a tensor arrive after this step?, the chunk it is for).

        The tensor comes from the previous rank in the ring (forward) or the next (backward).
        Usually it feeds this rank's next step. But the leading stage (the first rank going
        forward, the last going backward) runs pp - 1 steps ahead of the stage at the other end
        of the ring, which sends it; so what arrives belongs to the chunk after the one that
        stage is working on, found by looking pp - 1 steps back.
        """
        leading = mpu.is_pipeline_first_stage() if forward else mpu.is_pipeline_last_stage()
        if not leading:
            return True, self.get_model_chunk_id(virtual_microbatch_id + 1, forward)
        if virtual_microbatch_id < self.pp - 1:  # the other end has not produced anything yet
            return False, self.get_model_chunk_id(virtual_microbatch_id + 1, forward)
        sender_chunk = self.get_model_chunk_id(virtual_microbatch_id - (self.pp - 1), forward)
        last_chunk = self.num_model_chunks - 1 if forward else 0
        # The last chunk of the ring's end produces the loss (forward) or the first-layer
        # gradient (backward): nothing travels on from it.
        return sender_chunk != last_chunk, sender_chunk + 1 if forward else sender_chunk - 1

    # Gradient reduction across data-parallel ranks. ------------------------------------------
    def disable_grad_sync(self) -> None:
        """Let micro-batch gradients accumulate locally (DDP's no_sync over every chunk)."""
        if self.no_sync_context is None and self.config.no_sync_func is not None:
            self.no_sync_context = self.config.no_sync_func()
            self.no_sync_context.__enter__()

    def enable_grad_sync(self) -> None:
        """The next backward reduces the gradients. Megatron enables it before each chunk's last
        micro-batch, so each chunk's reduction can overlap the other chunks' compute; our
        no_sync covers all chunks at once, so it is enabled once, before the very last backward."""
        if self.no_sync_context is not None:
            self.no_sync_context.__exit__(None, None, None)
            self.no_sync_context = None

    # One forward, one backward. --------------------------------------------------------------
    def forward_step_helper(self, virtual_microbatch_id: int):
        """Forward one micro-batch through its chunk; return the output to send on."""
        chunk = self.get_model_chunk_id(virtual_microbatch_id, forward=True)
        microbatch_id = self.get_microbatch_id_in_model_chunk(virtual_microbatch_id)
        inputs = self.input_tensors[chunk]
        if self.is_first_stage(chunk) and len(inputs) == len(self.output_tensors[chunk]):
            inputs.append(None)  # chunk 0 of the first rank reads data: it receives no input
        # The first rank may hold several received inputs of a chunk at once (a group longer
        # than pp delivers them before it gets to them): pick this micro-batch's by its number,
        # less those already released.
        input_tensor = inputs[microbatch_id - self.num_released_microbatches(virtual_microbatch_id, chunk)]
        output_tensor, num_tokens = forward_step(
            self.forward_step_func, self.data_iterator[chunk], self.model[chunk], self.num_microbatches,
            input_tensor, self.forward_data_store, self.config, current_microbatch=microbatch_id, vp_stage=chunk)
        self.total_num_tokens = self.total_num_tokens + num_tokens   # nonzero on the loss chunk only
        self.output_tensors[chunk].append(output_tensor)
        if self.forward_only:  # nothing to keep for a backward
            inputs.pop(0)
            self.output_tensors[chunk].pop()
        return output_tensor

    def backward_step_helper(self, virtual_microbatch_id: int):
        """Backward the oldest waiting micro-batch of its chunk; return the gradient to send back."""
        chunk = self.get_model_chunk_id(virtual_microbatch_id, forward=False)
        if virtual_microbatch_id == self.total_num_microbatches - 1:
            self.enable_grad_sync()
        if self.is_last_stage(chunk) and not self.output_tensor_grads[chunk]:
            self.output_tensor_grads[chunk].append(None)  # the loss chunk starts from the loss itself
        return backward_step(
            self.input_tensors[chunk].pop(0), self.output_tensors[chunk].pop(0),
            self.output_tensor_grads[chunk].pop(0), self.config,
            current_microbatch=self.get_microbatch_id_in_model_chunk(virtual_microbatch_id), vp_stage=chunk)

    # The three phases. -----------------------------------------------------------------------
    def run_warmup(self) -> None:
        """Forwards only, each followed by the exchange that brings the next input."""
        shape, config = self.tensor_shape, self.config
        self.input_tensors[0].append(p2p.recv_forward(shape, config))
        for k in range(self.num_warmup_microbatches):
            chunk = self.get_model_chunk_id(k, forward=True)
            output_tensor = self.forward_step_helper(k)
            recv_prev, next_chunk = self.recv_tensor_from_previous_stage(k, forward=True)
            if k == self.total_num_microbatches - 1:
                recv_prev = False
            if self.is_last_stage(chunk):
                output_tensor = None  # the loss chunk sends nothing on
            last_warmup = k == self.num_warmup_microbatches - 1
            if last_warmup and not self.forward_only and not self.are_all_microbatches_in_warmup:
                # The first gradient is due with the last warm-up exchange: ask for it too.
                recv_next = not mpu.is_pipeline_last_stage()
                input_tensor, output_tensor_grad = p2p.send_forward_backward_recv_forward_backward(
                    output_tensor, None, recv_prev, recv_next, shape, config)
                if recv_next:
                    self.output_tensor_grads[self.num_model_chunks - 1].append(output_tensor_grad)
            else:
                input_tensor = p2p.send_forward_recv_forward(output_tensor, recv_prev, shape, config)
            if recv_prev:
                self.input_tensors[next_chunk].append(input_tensor)
            deallocate_output_tensor(output_tensor, self.dealloc)

    def run_steady_state(self) -> None:
        """One forward and one backward per step, their sends and receives in one exchange."""
        for i in range(self.num_microbatches_remaining):
            forward_k, backward_k = i + self.num_warmup_microbatches, i
            output_tensor = self.forward_step_helper(forward_k)
            input_tensor_grad = self.backward_step_helper(backward_k)
            if self.is_last_stage(self.get_model_chunk_id(forward_k, forward=True)):
                output_tensor = None
            if self.is_first_stage(self.get_model_chunk_id(backward_k, forward=False)):
                input_tensor_grad = None
            recv_prev, next_forward_chunk = self.recv_tensor_from_previous_stage(forward_k, forward=True)
            recv_next, next_backward_chunk = self.recv_tensor_from_previous_stage(backward_k, forward=False)
            if i == self.num_microbatches_remaining - 1:
                recv_prev = False  # no forward is left to feed
            input_tensor, output_tensor_grad = p2p.send_forward_backward_recv_forward_backward(
                output_tensor, input_tensor_grad, recv_prev, recv_next, self.tensor_shape, self.config)
            deallocate_output_tensor(output_tensor, self.dealloc)
            if recv_prev:
                self.input_tensors[next_forward_chunk].append(input_tensor)
            if recv_next:
                self.output_tensor_grads[next_backward_chunk].append(output_tensor_grad)

    def run_cooldown(self) -> None:
        """The backwards the warm-up still owes, each followed by the exchange for the next."""
        shape, config = self.tensor_shape, self.config
        if self.are_all_microbatches_in_warmup:
            self.output_tensor_grads[self.num_model_chunks - 1].append(p2p.recv_backward(shape, config))
        for k in range(self.num_microbatches_remaining, self.total_num_microbatches):
            input_tensor_grad = self.backward_step_helper(k)
            recv_next, next_chunk = self.recv_tensor_from_previous_stage(k, forward=False)
            if k == self.total_num_microbatches - 1:
                recv_next = False
            self.output_tensor_grads[next_chunk].append(
                p2p.send_backward_recv_backward(input_tensor_grad, recv_next, shape, config))


@traced(args=lambda **kw: {"num_microbatches": kw.get("num_microbatches"), "forward_only": kw.get("forward_only", False),
                         "chunks": len(kw.get("model", []))})
def forward_backward_pipelining_with_interleaving(*, forward_step_func, data_iterator, model,
                                                  num_microbatches, seq_length, micro_batch_size,
                                                  forward_only=False, **_):
    """Interleaved 1F1B over the model chunks in ``model`` (a list, one per virtual stage):
    warm-up, steady state, cool-down, as in 1F1B, with every step on one chunk."""
    schedule = _InterleavedSchedule(forward_step_func, data_iterator, model, num_microbatches, seq_length,
                                    micro_batch_size, forward_only)
    if not forward_only:
        schedule.disable_grad_sync()
    schedule.run_warmup()
    schedule.run_steady_state()
    if not forward_only:
        schedule.run_cooldown()
    schedule.enable_grad_sync()  # a no-op unless something left it disabled
    _finalize(schedule.config, model, forward_only, schedule.total_num_tokens)
    return schedule.forward_data_store
