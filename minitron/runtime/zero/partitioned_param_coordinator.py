"""Which parameters stage 3 gathers ahead and which it keeps: DeepSpeed's
``PartitionedParameterCoordinator`` (``zero/partitioned_param_coordinator.py``), in small.

The coordinator learns the model's order from one pass. The first forward of the engine starts
recording; every gather a module asks for, in forward and in backward, is one step of the trace.
The next forward finds the trace complete and from then on knows, at step k, what steps k + 1,
k + 2, ... will need:

    stage3_prefetch_bucket_size   after step k's own gather, gather the parameters of the next
                                  steps too, in one more all-gather, until that many elements are
                                  on their way (0: no prefetch)
    stage3_max_live_parameters    ... but stop once that many elements are gathered in all
    stage3_max_reuse_distance     when step k's module is done, keep (do not release) a parameter
                                  that comes back within that many elements of later steps: a
                                  layer's weights, used in its forward, come back in its backward

A pass that does not follow the trace (another order, an eval forward without backward) makes it
invalid, and the pass after records again, as DeepSpeed's does; with ``log_trace_cache_warnings``
rank 0 prints a line saying where (DeepSpeed's "Invalidate trace cache @ step ..."), since each
invalidation costs a pass without prefetch and a silent one is hard to find. Persistent parameters
(``ds_persist``, stage3_param_persistence_threshold) are never released, so never gathered here.

The trace holds parameters, not modules: a module holds the optimizer through its hooks, and
the optimizer holding the module back would be a cycle that reference counting cannot free.
"""

from __future__ import annotations

import collections

from minitron.trace import traced
from minitron.runtime.zero.partition_parameters import print_rank_0

INVALID, RECORD, COMPLETE = "INVALID", "RECORD", "COMPLETE"   # DeepSpeed's ZeRoTraceMode


def mark_persistent_parameters(module, partitioned, param_threshold: int, model_threshold: int) -> None:
    """DeepSpeed's mark_persistent_parameters (parameter_offload.py): a parameter of at most
    ``param_threshold`` elements is persistent (``ds_persist``), in the module's order, while the
    persistent total stays within ``model_threshold``. Stage 3 gathers those once and keeps them
    whole: a gather per small bias or norm would cost more in latency than the bytes it saves.
    Their gradients are reduce-scattered and their optimizer state partitioned as the others'."""
    total = 0
    for _, p in module.named_parameters():
        p.ds_persist = False
        if p in partitioned and p.ds_numel + total <= model_threshold and p.ds_numel <= param_threshold:
            p.ds_persist, total = True, total + p.ds_numel


def _name(module) -> str:
    """How a warning names a module: its class and DeepSpeed's number for it (stage3.py sets it)."""
    return f"{getattr(module, 'ds_id', '?')} ({type(module).__name__})"


class PartitionedParameterCoordinator:
    def __init__(self, prefetch_bucket_size: int, max_live_parameters: int, max_reuse_distance: int):
        self.prefetch_bucket_size = prefetch_bucket_size
        self.max_live_parameters = max_live_parameters
        self.max_reuse_distance = max_reuse_distance
        self.mode = INVALID
        self.order: list = []           # per step: (id of the module, its parameters, its name)
        self.queue: collections.deque = collections.deque()   # (param, step it is used at), in trace order
        self.step_id = 0
        self.fetched_for: dict = {}     # param -> the latest step it has been gathered (or passed over) for
        self.log_trace_cache_warnings = False

    def reset_step(self) -> None:
        """The model's forward begins: one fwd+bwd has ended (DeepSpeed calls it from a hook
        on the root module's forward). The parameter trace, in DeepSpeed's order: step by
        step, each module's parameters in the order they were made."""
        if self.mode == RECORD and self.order:
            self.mode = COMPLETE
        elif self.mode != COMPLETE:
            self.mode, self.order = RECORD, []
        self.queue = collections.deque((p, step) for step, (_, params, _) in enumerate(self.order)
                                       for p in sorted({id(p): p for p in params}.values(), key=lambda p: getattr(p, "ds_id", 0)))
        self.step_id, self.fetched_for = 0, {}

    def _follows(self, module) -> bool:
        if self.mode == COMPLETE and self.step_id >= len(self.order):
            self._invalidate_trace(f"cache has only {len(self.order)} modules")
        elif self.mode == COMPLETE and self.order[self.step_id][0] != id(module):
            self._invalidate_trace(f"expected module {self.order[self.step_id][2]}, but got module "
                                   f"{_name(module)}")
        return self.mode == COMPLETE

    @traced(name="minitron.runtime.zero.partitioned_param_coordinator.invalidate_trace",
            args=lambda self, why: {"step": self.step_id, "why": why})
    def _invalidate_trace(self, why: str) -> None:
        """The pass left the trace: record the next one."""
        self.mode, self.order = INVALID, []
        if self.log_trace_cache_warnings:
            print_rank_0(f"Invalidate trace cache @ step {self.step_id}: {why}")

    @traced(name="minitron.runtime.zero.partitioned_param_coordinator.fetch_sub_module",
            args=lambda self, module, params, gather, available: {"step": self.step_id, "mode": self.mode})
    def fetch_sub_module(self, module, params: list, gather, available) -> None:
        """Gather ``params`` (module's), then, on a complete trace, prefetch what comes next.
        ``gather`` all-gathers a list of parameters; ``available()`` counts gathered elements."""
        gather(params)
        if self.mode == RECORD:
            self.order.append((id(module), list(params), _name(module)))
        elif self._follows(module):
            # Pass over the trace's entries for my own parameters (those not gathered ahead).
            mine = {id(p) for p in params if self.fetched_for.get(p, -1) < self.step_id}
            passed = set()
            while self.queue and len(passed) < len(mine):
                p, used_at = self.queue.popleft()
                self.fetched_for[p] = used_at
                passed.add(id(p))
            if self.prefetch_bucket_size > 0:
                self._prefetch(gather, available)
        self.step_id += 1

    def _prefetch(self, gather, available) -> None:
        """The next entries of the trace, until the bucket's elements are on their way: one
        all-gather for the missing ones. An entry passed over (its parameter still gathered) is
        remembered, so that the module before that use does not release it."""
        budget = min(self.max_live_parameters - available(), self.prefetch_bucket_size)
        ahead, numel = {}, 0
        while self.queue and numel < budget:
            p, used_at = self.queue.popleft()
            self.fetched_for[p] = max(self.fetched_for.get(p, -1), used_at)
            if p.ds_status != "AVAILABLE" and id(p) not in ahead:
                ahead[id(p)] = p
                numel += p.ds_numel
        if ahead:
            gather(list(ahead.values()))

    def params_to_release(self, params: list) -> list:
        """Of a module's parameters, once it has run (forward, or backward). Until the trace is
        complete: all of them, the persistent ones too (DeepSpeed's first pass gathers those at
        first use and releases them like the others; the step's gather then keeps them). On a
        complete trace: not the persistent ones, nor those gathered ahead for a later step, nor
        those that come back within max_reuse_distance elements of the steps that follow."""
        if self.mode != COMPLETE:
            return list(params)
        out = [p for p in params if not getattr(p, "ds_persist", False)]
        keep, traversed = set(), 0
        for _, later, _ in self.order[self.step_id:]:
            if traversed >= self.max_reuse_distance:
                break
            for p in later:
                keep.add(id(p))
                traversed += p.ds_numel
        return [p for p in out if id(p) not in keep and self.fetched_for.get(p, -1) <= self.step_id]
