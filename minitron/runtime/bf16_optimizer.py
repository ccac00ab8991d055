"""DeepSpeed 0.19.8's ``BF16_Optimizer`` (``deepspeed/runtime/bf16_optimizer.py``), small: what the
engine builds for a bf16 model at ZeRO stage 1 when ``data_types.grad_accum_dtype`` is fp32 (and
the optimizer is not offloaded to the CPU).

It keeps ZeRO-1's layout (bf16 flat buffer, dp partitions, an fp32 master of my partition: the
base class builds it) and changes where gradients live between micro-batches:

    after every backward   each bf16 gradient is added into a full-size fp32 buffer and dropped
                           (``update_hp_grads``), so a long accumulation sums in fp32, not bf16
    at the boundary        the engine all-reduces the fp32 buffers, as stage 0 does, in
                           communication_data_type - which defaults to bf16 for a bf16 model,
                           so the sum itself is bf16 unless the config says "fp32"; every rank
                           then holds the whole mean and steps only its partition of it
    the step               the global norm, clipping, the fp32 masters' update, the bf16 copy and
                           the all-gather, as ZeRO-1; a non-finite norm skips the step whatever
                           bf16.check_grad_overflow says (BF16_Optimizer always checks)

What it costs: 4 bytes a parameter of fp32 gradient on every rank (where ZeRO-1 holds 2 of bf16).
bf16.immediate_grad_update moves the first row into backward: a hook adds each gradient as soon as
autograd completes it, so the whole bf16 gradient never exists at once (the same sums).
"""

from __future__ import annotations

import torch

from minitron import comm as dist
from minitron.runtime.zero.buckets import weakly_bound
from minitron.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from minitron.trace import traced


class BF16_Optimizer(DeepSpeedZeroOptimizer):   # noqa: N801 (DeepSpeed's name)
    check_grad_overflow = True

    def __init__(self, init_optimizer, dp_process_group, loss_scaler, clip_grad: float = 0.0,
                 model_parallel_group=None, model_parallel_rank: int | None = None,
                 immediate_grad_update: bool = False):
        super().__init__(init_optimizer, dp_process_group, 1, loss_scaler, clip_grad, model_parallel_group,
                         model_parallel_rank=model_parallel_rank)
        # fp32_groups_gradients_flat: the whole gradient in fp32, padding included, one per group
        self.fp32_groups_gradients_flat = [torch.zeros_like(flat, dtype=torch.float32)
                                           for flat in self.bit16_groups_flat]
        self._hp_of = {}   # param -> its slice of the fp32 buffer
        for params, hp in zip(self.bit16_groups, self.fp32_groups_gradients_flat):
            offset = 0
            for p in params:
                self._hp_of[p] = hp[offset:offset + p.numel()]
                offset += p.numel()
        if immediate_grad_update:   # bf16.immediate_grad_update: add each gradient the moment it is complete
            for p in self._hp_of:
                p.register_post_accumulate_grad_hook(weakly_bound(self._accumulate))

    @torch.no_grad()
    def _accumulate(self, p: torch.Tensor) -> None:
        """One bf16 gradient into its fp32 slice, and dropped: with immediate_grad_update, while
        backward goes on, so at most the layer in flight holds a bf16 gradient; the same sums."""
        self._hp_of[p].add_(p.grad.reshape(-1).float())
        p.grad = None

    @torch.no_grad()
    def update_hp_grads(self) -> None:
        """This micro-batch's bf16 gradients into the fp32 buffers; the bf16 ones dropped (with
        immediate_grad_update the hooks did it already)."""
        for p in self._hp_of:
            if p.grad is not None:
                self._accumulate(p)

    @traced(args=lambda self, boundary, all_reduce=True: {"boundary": boundary})
    @torch.no_grad()
    def reduce_gradients(self, is_gradient_accumulation_boundary: bool, all_reduce: bool = True) -> None:
        """After every backward (the engine's _backward_epilogue): accumulate; at the boundary,
        all-reduce each fp32 buffer (the engine's buffered_allreduce_fallback) and keep my
        partition of the mean for the step."""
        self.update_hp_grads()
        if not is_gradient_accumulation_boundary:
            return
        reduction = self.gradient_reduction   # the engine's rules, in the wire dtype (engine_optimizer.py)
        for i, hp in enumerate(self.fp32_groups_gradients_flat):
            wire = reduction.to_wire(hp)   # a bf16 copy, or hp itself in fp32
            dist.all_reduce(wire, group=self.dp_process_group)
            mean = reduction.from_wire(wire, torch.float32)
            if mean is not hp:
                hp.copy_(mean)
            size = hp.numel() // self.partition_count
            self.averaged_gradients[i] = hp.narrow(0, self.partition_id * size, size)

    def zero_grad(self) -> None:
        super().zero_grad()
        for hp in self.fp32_groups_gradients_flat:   # clear_hp_grads
            hp.zero_()

    def bytes_held(self) -> dict:
        held = super().bytes_held()
        held["grads"] = sum(hp.numel() * hp.element_size() for hp in self.fp32_groups_gradients_flat)
        return held
