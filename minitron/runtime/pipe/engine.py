"""DeepSpeed's ``PipelineEngine`` (``deepspeed/runtime/pipe/engine.py``), small: the engine that
``initialize()`` returns for a PipelineModule, driven by ``train_batch()`` instead of the
forward / backward / step triple.

``train_batch(data_iter)`` runs one whole global batch: it asks ``TrainSchedule`` (schedule.py)
for this stage's instruction stream and executes it instruction by instruction, each through
its ``_exec_*`` method (``_INSTRUCTION_MAP``). Every executed instruction is a traced step,
recorded with its schedule step, buffer and micro-batch, which is what ``minitron view`` draws.

What the engine holds per buffer slot (``pipe_buffers``): the inputs (loaded or received), the
labels (last stage), the outputs of the forward. A slot is freed by the backward that consumes
it, so at most ``num_pipe_buffers()`` micro-batches' activations are alive at once.

Where the parent engine (runtime/engine.py) still does the work: the last stage's BackwardPass
is its ``backward(loss)`` (divide by the accumulation steps, times the loss scale), and
OptimizerStep is its model step (ZeRO-0/1's clip, update, all-gather). Gradients are reduced
only when the stream says ReduceGrads: ``is_gradient_accumulation_boundary()`` is False except
while that instruction (or OptimizerStep) runs.
"""

from __future__ import annotations

import torch

from minitron import comm as dist   # as DeepSpeed's: from deepspeed import comm as dist
from minitron.runtime.engine import DeepSpeedEngine
from minitron.runtime.pipe import p2p, schedule
from minitron.runtime.pipe.module import PipelineModule
from minitron.trace import traced


def _instruction_args(self, buffer_id=None) -> dict:
    """What the trace keeps of an executed instruction: the schedule (train or inference) and
    its step, the buffer slot, and which micro-batch it concerns (the n-th instruction of a kind
    is micro-batch n)."""
    return {"schedule": self._schedule_name, "step": self._step_id, "buffer_id": buffer_id,
            "microbatch": self._microbatch}


def _floats(tensors) -> list:
    return [t for t in (tensors if isinstance(tensors, tuple) else (tensors,)) if t.is_floating_point()]


class PipelineEngine(DeepSpeedEngine):
    runs_pipelines = True   # the parent refuses a pipelined mpu; this engine is what runs one

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if not isinstance(self.module, PipelineModule):
            raise TypeError("the PipelineEngine runs a PipelineModule")
        if self.zero_optimization_stage() >= 2:
            raise ValueError("ZeRO-2 and ZeRO-3 are incompatible with pipeline parallelism")
        self.grid = self.module.mpu()
        self.micro_batches = self.gradient_accumulation_steps()
        self.num_stages, self.stage_id = self.grid.pipe_parallel_size, self.grid.get_stage_id()
        self.prev_stage, self.next_stage = self.stage_id - 1, self.stage_id + 1
        self.is_pipe_parallel = self.num_stages > 1
        self.is_data_parallel = self.grid.data_parallel_size > 1
        pipeline = self._config.pipeline   # the ds_config's section (runtime/config_pipeline.py)
        if self.grid.model_parallel_size > 1 and (pipeline["pipe_partitioned"] or pipeline["grad_partitioned"]):
            raise ValueError("pipeline.pipe_partitioned / grad_partitioned with a model axis cut what stages send "
                             "into model-parallel pieces, which minitron does not build; set both false")
        if pipeline["activation_checkpoint_interval"] > 0:   # the config's overrides the module's own
            self.module.activation_checkpoint_interval = pipeline["activation_checkpoint_interval"]
        if self.is_pipe_parallel:
            p2p.init_process_groups(self.grid)
        self.data_iterator, self.batch_fn = None, None
        self._force_grad_boundary = False
        self.pipe_buffers = {"inputs": [], "labels": [], "outputs": []}
        self.pipe_recv_buf, self.grad_layer = None, None
        self.first_output_send = True
        self.loss, self.total_loss, self.agg_train_loss = None, None, None
        self._schedule_name, self._step_id, self._microbatch = None, None, None

    # --- the client's calls ----------------------------------------------------------------

    def set_dataiterator(self, iterator) -> None:
        """Only the first stage (inputs) and the last (labels) read data."""
        if self.is_first_stage() or self.is_last_stage():
            self.data_iterator = iterator

    def set_batch_fn(self, fn) -> None:
        """``fn(batch) -> (inputs, labels)``: turns what the iterator yields into the pair
        LoadMicroBatch expects (Megatron-DeepSpeed's get_batch_pipe)."""
        self.batch_fn = fn

    def train_batch(self, data_iter=None, lr_kwargs: dict | None = None) -> torch.Tensor:
        """One global batch: ``gradient_accumulation_steps()`` micro-batches through the
        pipeline, the reductions and one optimizer step. Returns the batch's mean loss on
        every rank. (``lr_kwargs`` go to the lr schedule's step, as in the parent's step():
        Megatron's schedule counts samples. DeepSpeed's train_batch has no such argument.)"""
        if not torch.is_grad_enabled():
            raise RuntimeError("train_batch() requires gradients enabled. Use eval_batch() instead.")
        if data_iter is not None:
            self.set_dataiterator(data_iter)
        self.module.train()
        self.total_loss, self._lr_kwargs = None, lr_kwargs
        self._exec_schedule(schedule.TrainSchedule(self.micro_batches, self.num_stages, self.stage_id))
        with torch.no_grad():
            self.agg_train_loss = self._aggregate_total_loss()
        if self.global_rank == 0 and self.monitor.enabled:   # the one event DeepSpeed's pipeline engine writes
            self.monitor.write_events([("Train/Samples/train_loss", self.agg_train_loss.mean().item(),
                                        self.global_samples)])
        return self.agg_train_loss

    def eval_batch(self, data_iter) -> torch.Tensor:
        """Forward only over the same number of micro-batches (InferenceSchedule); the mean
        loss, on every rank. Nothing is stored for a backward."""
        self.set_dataiterator(data_iter)
        self.module.eval()
        self.total_loss = None
        with torch.no_grad():
            self._exec_schedule(schedule.InferenceSchedule(self.micro_batches, self.num_stages, self.stage_id))
            loss = self._aggregate_total_loss()
        self.module.train()
        return loss

    def is_first_stage(self) -> bool:
        return self.stage_id == 0

    def is_last_stage(self) -> bool:
        return self.stage_id == self.num_stages - 1

    def is_gradient_accumulation_boundary(self) -> bool:
        """True only while ReduceGrads or OptimizerStep runs: the stream decides."""
        return self._force_grad_boundary

    # --- executing a stream -------------------------------------------------------------------

    def _exec_schedule(self, pipe_schedule) -> None:
        slots = pipe_schedule.num_pipe_buffers()
        for key in self.pipe_buffers:
            self.pipe_buffers[key] = [None] * slots
        counts: dict[str, int] = {}
        self._schedule_name = type(pipe_schedule).__name__
        for self._step_id, step_cmds in enumerate(pipe_schedule):
            for cmd in step_cmds:
                if type(cmd) not in self._INSTRUCTION_MAP:
                    raise RuntimeError(f"{type(self).__name__} does not understand instruction {cmd!r}")
                per_micro_batch = isinstance(cmd, schedule.BufferOpInstruction)
                self._microbatch = counts.get(cmd.name, 0) if per_micro_batch else None
                counts[cmd.name] = counts.get(cmd.name, 0) + per_micro_batch
                self._INSTRUCTION_MAP[type(cmd)](self, **cmd.kwargs)
        self._step_id = self._microbatch = None

    def _next_batch(self):
        batch = next(self.data_iterator) if self.data_iterator is not None else None
        return self.batch_fn(batch) if self.batch_fn else batch

    def _to_device(self, tensors):
        """A loaded micro-batch (a tensor or a tuple of them) on this rank's device, copied: the
        data loader may reuse what it handed out."""
        if isinstance(tensors, (tuple, list)):
            return tuple(self._to_device(t) for t in tensors)
        return tensors.clone().detach().to(self.device) if torch.is_tensor(tensors) else tensors

    @traced(args=_instruction_args)
    def _exec_load_micro_batch(self, buffer_id: int) -> None:
        inputs, labels = self._next_batch()
        if self.is_first_stage():
            loaded = self._to_device(inputs)
            if self.module.activation_checkpoint_interval > 0:   # the reentrant checkpoint's output needs
                for t in (loaded if isinstance(loaded, tuple) else (loaded,)):   # an input that requires grad
                    if torch.is_tensor(t):
                        t.requires_grad = t.is_floating_point()
            self.pipe_buffers["inputs"][buffer_id] = loaded
        if self.is_last_stage():
            self.pipe_buffers["labels"][buffer_id] = self._to_device(labels)

    @traced(args=_instruction_args)
    def _exec_forward_pass(self, buffer_id: int) -> None:
        inputs = self.pipe_buffers["inputs"][buffer_id]
        with self.autocast():   # torch_autocast, as the data-parallel engine's forward (engine.py)
            outputs = self.module(inputs)
        self.pipe_buffers["outputs"][buffer_id] = outputs
        if self.is_last_stage():
            loss_fn = self.module.loss_fn
            self.loss = loss_fn(outputs, self.pipe_buffers["labels"][buffer_id]) if loss_fn else outputs
            detached = self.loss.detach()
            self.total_loss = detached.clone() if self.total_loss is None else self.total_loss + detached

    @traced(args=_instruction_args)
    def _exec_backward_pass(self, buffer_id: int) -> None:
        if self.is_last_stage():
            # The parent's backward: loss / accumulation steps, times the loss scale, backward.
            # Its gradient reduction waits, since this is no boundary (ReduceGrads is).
            super().backward(self.loss)
        else:
            # The received gradient already carries the last stage's division and loss scale.
            outputs = _floats(self.pipe_buffers["outputs"][buffer_id])
            torch.autograd.backward(tensors=outputs, grad_tensors=list(self.grad_layer))
        self.pipe_buffers["outputs"][buffer_id] = None   # the activations are no longer needed

    @traced(args=_instruction_args)
    def _exec_send_activations(self, buffer_id: int) -> None:
        outputs = self.pipe_buffers["outputs"][buffer_id]
        tensors = outputs if isinstance(outputs, tuple) else (outputs,)
        if self.first_output_send:   # shapes once; every later micro-batch has the same
            self.first_output_send = False
            p2p.send_tensor_meta(tensors, self.next_stage)
        for t in tensors:
            p2p.send(t.detach().contiguous(), self.next_stage)

    @traced(args=_instruction_args)
    def _exec_recv_activations(self, buffer_id: int) -> None:
        if self.pipe_recv_buf is None:
            self.pipe_recv_buf = p2p.recv_tensor_meta(self.prev_stage)
        received = []
        for buf in self.pipe_recv_buf:
            p2p.recv(buf, self.prev_stage)
            t = buf.clone().detach()   # the buffer is reused; the copy is this micro-batch's
            t.requires_grad = t.is_floating_point()   # so that backward yields its gradient
            received.append(t)
        self.pipe_buffers["inputs"][buffer_id] = received[0] if len(received) == 1 else tuple(received)

    @traced(args=_instruction_args)
    def _exec_send_grads(self, buffer_id: int) -> None:
        for t in _floats(self.pipe_buffers["inputs"][buffer_id]):
            p2p.send(t.grad, self.prev_stage)
        self.pipe_buffers["inputs"][buffer_id] = None   # sent its gradient: the input is done

    @traced(args=_instruction_args)
    def _exec_recv_grads(self, buffer_id: int) -> None:
        outputs = _floats(self.pipe_buffers["outputs"][buffer_id])
        if self.grad_layer is None:   # one buffer per output tensor, reused every micro-batch
            self.grad_layer = tuple(torch.zeros_like(t) for t in outputs)
        for buf in self.grad_layer:
            p2p.recv(buf, self.next_stage)

    @traced(args=_instruction_args)
    def _exec_reduce_tied_grads(self) -> None:
        self.module.allreduce_tied_weight_gradients()

    @traced(args=_instruction_args)
    def _exec_reduce_grads(self) -> None:
        self._force_grad_boundary = True
        self.optimizer.reduce_gradients(True)   # ZeRO-0: all-reduce; ZeRO-1: reduce-scatter
        self._force_grad_boundary = False

    @traced(args=_instruction_args)
    def _exec_optimizer_step(self) -> None:
        self._force_grad_boundary = True
        self._take_model_step(self._lr_kwargs)
        self._force_grad_boundary = False

    _INSTRUCTION_MAP = {
        schedule.OptimizerStep: _exec_optimizer_step,
        schedule.ReduceGrads: _exec_reduce_grads,
        schedule.ReduceTiedGrads: _exec_reduce_tied_grads,
        schedule.LoadMicroBatch: _exec_load_micro_batch,
        schedule.ForwardPass: _exec_forward_pass,
        schedule.BackwardPass: _exec_backward_pass,
        schedule.SendActivation: _exec_send_activations,
        schedule.RecvActivation: _exec_recv_activations,
        schedule.SendGrad: _exec_send_grads,
        schedule.RecvGrad: _exec_recv_grads,
    }

    # --- the loss every rank reports -----------------------------------------------------------

    def _aggregate_total_loss(self) -> torch.Tensor:
        """The last stage averages its micro-batches' losses and the data-parallel replicas'
        means; the other stages of the pipeline get the number by broadcast."""
        losses = torch.zeros(1, device=self.device)
        if self.is_last_stage():
            losses = (self.total_loss.float() / self.micro_batches).view(1)
            if self.is_data_parallel:
                dist.all_reduce(losses, group=self.grid.get_data_parallel_group())
                losses /= self.grid.data_parallel_size
        if self.is_pipe_parallel:
            dist.broadcast(losses, self.grid.stage_to_global(self.num_stages - 1),
                           group=self.grid.get_pipe_parallel_group())
        return losses[0]
