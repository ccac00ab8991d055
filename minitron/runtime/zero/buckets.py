"""ZeRO-2's gradient buckets: DeepSpeed's "independent partition gradient" (ipg) bucket, small.

At stage 2 no rank keeps a whole gradient, so gradients are reduced while backward still runs,
in the order autograd finishes them (the last layer first). Each parameter's hook fires once
its gradient for this micro-batch is complete and puts it in the bucket; when the next one
would take the bucket past ``reduce_bucket_size`` elements, the bucket is reduced and its
gradients dropped. The last, partial bucket is reduced after backward (the engine's
``reduce_gradients``). The bucket bounds the full-size gradients alive at any moment, and in
DeepSpeed (with overlap_comm) its reduction runs while backward computes the next bucket.

Reducing a bucket: every element of it belongs to one rank's partition of the flat buffer
(stage_1_and_2.py). DeepSpeed's default (``use_multi_rank_bucket_allreduce``) all-reduces the
whole bucket in one call and each rank keeps the pieces it owns: one message per bucket, however
many ranks own a part of it, which pays when the model is small and the ranks many. With it
false, for each owner in turn the pieces it owns are put end to end and summed onto it with one
``reduce``; the owner adds the sum, divided by dp, into its partition's gradient: half the bytes
of an all-reduce reach each rank, in one call per owner (DeepSpeed reduces each (owner, offset)
run of the bucket on its own; one call per owner moves the same bytes in fewer, larger
messages). Every rank runs the same backward, so the buckets and the calls come in the same
order everywhere, as collectives must.
"""

from __future__ import annotations

import weakref

import torch

from minitron import comm as dist   # as DeepSpeed's ZeRO: from deepspeed import comm as dist
from minitron.trace import traced


def weakly_bound(method):
    """``method``, a bound method, as a parameter hook that holds its object weakly and does
    nothing once the object is gone. A tensor's hooks are kept by torch's C++ side, where the
    cyclic collector cannot look: a hook holding the ZeRO optimizer would close the cycle
    parameter -> hook -> optimizer -> parameter, never freed, not even by gc.collect() (the
    DDP's hooks hold it weakly for the same reason). DeepSpeed's hooks hold the optimizer, and
    its process ends with the training; minitron's ranks may go on (tests, fake players)."""
    method_ref = weakref.WeakMethod(method)

    def hook(*args):
        bound = method_ref()
        if bound is not None:
            bound(*args)
    return hook


class GradientBuckets:
    """``overlap_comm``: each bucket's reduces are launched (async_op=True) and left in flight
    while backward goes on; DeepSpeed runs them on a second stream, with two bucket buffers, so
    at most two buckets travel at once and the rest of backward waits only to reuse a buffer.
    The last ones are waited for after backward (``finish``, DeepSpeed's epilogue)."""

    def __init__(self, optimizer, reduce_bucket_size: int, overlap_comm: bool = False, hooks: bool = True):
        # The optimizer holds these buckets (optimizer.buckets) and they hold it weakly: a
        # plain cycle would wait for the collector's next full pass.
        self._opt = weakref.ref(optimizer)
        self.bucket_size, self.overlap_comm = reduce_bucket_size, overlap_comm
        # One bucket per wire dtype: one only, unless torch_autocast marks some parameters'
        # gradients to travel in its dtype (DeepSpeed's ipg_buckets, keyed the same way)
        self.params: dict = {}   # wire dtype -> the bucket's parameters
        self.elements: dict = {}
        self.in_flight: list = []   # launched buckets: (pieces I own, their sum, handles)
        self.where: dict = {}   # param -> (group index, its offset in the group's flat buffer)
        for i, params in enumerate(optimizer.bit16_groups):
            offset = 0
            for p in params:
                self.where[p] = (i, offset)
                offset += p.numel()
                if hooks:   # without: the caller hands each gradient in (stage 1 after backward)
                    p.register_post_accumulate_grad_hook(weakly_bound(self.grad_ready))

    @property
    def opt(self):
        return self._opt()

    def grad_ready(self, p: torch.Tensor) -> None:
        # Stage 1 (overlap_comm) reduces in backward only at the accumulation boundary: before
        # it, gradients add up in p.grad as plain PyTorch leaves them (DeepSpeed's
        # reduce_ready_partitions_and_remove_grads).
        if not self.opt.partition_gradients and not self.opt.is_gradient_accumulation_boundary:
            return
        dtype = self.opt.gradient_reduction.for_param(p).dtype
        if self.params.get(dtype) and self.elements[dtype] + p.numel() > self.bucket_size:
            self.reduce(dtype)
        self.params.setdefault(dtype, []).append(p)
        self.elements[dtype] = self.elements.get(dtype, 0) + p.numel()

    @traced(args=lambda self, dtype=None: {"params": len(self.params.get(dtype, ())),
                                           "elements": self.elements.get(dtype, 0), "async": self.overlap_comm,
                                           **({"dtype": str(dtype)} if len(self.params) > 1 else {})})
    @torch.no_grad()
    def reduce(self, dtype=None) -> None:
        """Sum the bucket of wire dtype ``dtype`` onto the partitions' owners (launched only,
        with overlap_comm); drop its gradients."""
        params = self.params.pop(dtype, None)
        self.elements.pop(dtype, None)
        if not params:
            return
        opt = self.opt
        reduction = opt.gradient_reduction.for_param(params[0])   # the bucket's dtype on the wire
        group = opt.dp_process_group
        bucket = torch.cat([p.grad.reshape(-1) for p in params])
        owned: dict = {}   # owner -> [(group index, offset in the owner's partition, offset in bucket, n)]
        at = 0
        for p in params:
            i, start = self.where[p]
            size = opt.bit16_groups_flat[i].numel() // opt.partition_count
            first, end = start, start + p.numel()
            while first < end:   # a parameter may straddle two partitions
                owner = first // size
                n = min(end, (owner + 1) * size) - first
                owned.setdefault(owner, []).append((i, first - owner * size, at + first - start, n))
                first += n
            at += p.numel()
        if self.overlap_comm and len(self.in_flight) == 2:
            self._wait(*self.in_flight.pop(0))   # both bucket buffers busy: wait for the older
        mine, handles = None, []
        # DeepSpeed's default: the whole bucket, once; my pieces where they lie in it (so too without
        # contiguous_gradients or reduce_scatter: its buffered_reduce_fallback)
        if opt.use_multi_rank_bucket_allreduce or reduction.all_reduce:
            summed = reduction.to_wire(bucket)
            handles.append(dist.all_reduce(summed, group=group, async_op=self.overlap_comm))
            mine = (owned[opt.partition_id], summed) if opt.partition_id in owned else None
            owned = {}
        for owner in sorted(owned):   # else: onto each owner, its pieces end to end
            pieces, k = [], 0   # (group, offset in the partition, where in the sum, elements)
            for i, offset, _, n in owned[owner]:
                pieces.append((i, offset, k, n))
                k += n
            summed = reduction.to_wire(torch.cat([bucket[b:b + n] for _, _, b, n in owned[owner]]))
            handles.append(dist.reduce(summed, dst=dist.get_global_rank(group, owner), group=group,
                                       async_op=self.overlap_comm))
            if owner == opt.partition_id:
                mine = (pieces, summed)
        launched = (mine, [h for h in handles if h is not None])
        if self.overlap_comm:
            self.in_flight.append(launched)
        else:
            self._add(mine)
        for p in params:
            p.grad = None

    @traced(args=lambda self, mine, handles: {"handles": len(handles)})
    def _wait(self, mine, handles) -> None:
        """An overlapped bucket: wait for its reduces, then take my pieces of the sum."""
        for handle in handles:
            handle.wait()
        self._add(mine)

    def _add(self, mine) -> None:
        """My pieces of a reduced bucket, averaged, into my partition's gradient."""
        if mine is None:
            return
        opt, (pieces, summed) = self.opt, mine
        # the sum over ranks -> the mean over the batch, back in the gradients' dtype
        summed = opt.gradient_reduction.from_wire(summed, opt.bit16_groups_flat[0].dtype)
        for i, offset, k, n in pieces:   # k: where the piece lies in the sum
            size = opt.bit16_groups_flat[i].numel() // opt.partition_count
            if i not in opt.averaged_gradients:   # on the device the gradients were reduced on
                opt.averaged_gradients[i] = summed.new_zeros(size)
            opt.averaged_gradients[i][offset:offset + n].add_(summed[k:k + n])

    def reduce_all(self) -> None:
        """Stage 1 under torch_autocast: every gradient, after the boundary's backward, into the
        bucket of its wire dtype (marked parameters in autocast's, the rest in their own), as
        DeepSpeed's reduce_gradients hands each one to its ipg buckets; then reduce them all."""
        for params in self.opt.bit16_groups:
            for p in params:
                if p.grad is not None:
                    self.grad_ready(p)
        self.finish()

    def finish(self) -> None:
        """After backward: reduce the last, partial buckets (by dtype name, as DeepSpeed's
        sort_dtypes) and wait for every one in flight."""
        for dtype in sorted(self.params, key=str):
            self.reduce(dtype)
        while self.in_flight:
            self._wait(*self.in_flight.pop(0))
