"""FSDPUnit: the parameters of one module in one flat buffer, cut into dp equal shards.

Every parameter of the unit becomes a view into one flat buffer (``flat``), laid out and padded
as Megatron-FSDP lays out its buckets (buffer_index.py: rows kept whole on chunk boundaries,
the buffer a multiple of dp chunks) so that it splits into dp equal shards; rank r owns
elements [r*S, (r+1)*S), and the gaps between parameters stay zero. What the rank keeps
depends on the strategy:

    strategy              parameters            gradients              optimizer steps
    no_shard              flat, whole           grad_flat, whole       all of flat
    optim                 flat, whole           grad_flat, whole       its shard of flat
    optim_grads           flat, whole           its shard only         its shard of flat
    optim_grads_params    its shard; flat only  its shard only         its own shard
                          while the unit runs

Freeing without breaking autograd: a layer's forward saves its weight for backward. The weight
is a view of ``flat``, so the unit frees the *storage* under ``flat`` (resize to 0 bytes) and
refills it before backward (gather). The saved views then see the gathered values again; the
gather writes through ``flat``, a tensor autograd never saw, so no saved tensor's version
counter moves and backward does not mistake the refill for an in-place edit.

fp8 weights (--fp8-param-gather, core/fp8/param_gather.py) form units of their own, as
Megatron-FSDP keeps one buffer per dtype in a unit: ``flat`` holds their fp8 bytes, so the
all-gather moves one byte an element (as uint8: the collectives know no fp8 dtype), and every
rank already holds the 1/scale that goes with them (the same on all: param_gather.py). The fp8
linear adds its weight gradient to ``main_grad`` (fp8/linear.py), in the weight's nominal dtype
(bf16) or fp32: views into the unit's gradient buffer, whole from the unit's backward to its
reduce-scatter.
"""

from __future__ import annotations

import torch

from minitron.core.distributed.fsdp.buffer_index import build_buffer_index
from minitron.core.fp8.param_gather import is_fp8_param
from minitron.trace import traced


def _wire(t: torch.Tensor) -> torch.Tensor:
    """What a collective sends of ``t``: fp8 bytes as uint8 (gloo and NCCL have no fp8 dtype)."""
    return t.view(torch.uint8) if is_fp8_param(t) else t


class FSDPUnit:
    def __init__(self, name: str, params: list, strategy: str, group, gradient_scaling_factor: float,
                 grad_dtype=None, comm_dtype=None):
        self.name, self.params, self.strategy, self.group = name, params, strategy, group
        self.gradient_scaling_factor = gradient_scaling_factor
        dtypes = {p.dtype for p in params}
        if len(dtypes) != 1:
            raise ValueError(f"FSDP unit {name} mixes parameter dtypes {sorted(map(str, dtypes))}: one flat "
                             "buffer holds one dtype")
        dp = torch.distributed.get_world_size(group=group)
        rank = torch.distributed.get_rank(group=group)
        self.numel = sum(p.numel() for p in params)
        self.index = build_buffer_index([p.shape for p in params], dp, sharded=strategy != "no_shard")
        self.shard_size = self.index.shard_size
        padded = self.index.size
        # [lo, hi): the part of flat whose update (and, sharded, whose gradient) this rank owns
        self.lo, self.hi = (0, padded) if strategy == "no_shard" else self.index.shard(rank)
        device = params[0].device
        self.flat = torch.zeros(padded, dtype=params[0].dtype, device=device)
        self.offsets = {}
        for p, offset in zip(params, self.index.offsets):
            n = p.numel()
            self.flat[offset:offset + n].copy_(p.detach().reshape(-1))
            p.data = self.flat[offset:offset + n].view_as(p)   # from here on the parameter lives in flat
            self.offsets[p] = offset
        self.sharded_params = strategy == "optim_grads_params"
        self.sharded_grads = strategy in ("optim_grads", "optim_grads_params")
        if self.sharded_params:
            self.shard = self.flat[self.lo:self.hi].clone()   # the one persistent copy of my part
            self.gathered = True
            self.free()
        else:
            self.shard = self.flat[self.lo:self.hi]             # a view: the step writes into the model
        # Gradients are kept and reduced in the parameters' dtype, or in fp32 with
        # --accumulate-allreduce-grads-in-fp32 (DDP's rule: summing many 16-bit numbers loses bits).
        # An fp8 weight's gradient is kept in the dtype it stands for (TE's Float8Tensor.dtype).
        self.fp8 = is_fp8_param(params[0])
        self.grad_dtype = grad_dtype or (params[0].fp8_nominal_dtype if self.fp8 else self.flat.dtype)
        # --megatron-fsdp-grad-comm-dtype: what the reductions send and sum in (default: the
        # gradients' own dtype); a 16-bit reduction of fp32 gradients halves the bytes sent
        self.comm_dtype = comm_dtype or self.grad_dtype
        if self.sharded_grads:
            self.grad_flat = None
            self.grad_shard = torch.zeros(self.shard_size, dtype=self.grad_dtype, device=device)
        else:
            self.grad_flat = torch.zeros(padded, dtype=self.grad_dtype, device=device)
            self.grad_shard = self.grad_flat[self.lo:self.hi]
            if self.fp8:   # the fp8 linears add into the whole buffer, which the step reduces
                for p in params:
                    p.main_grad = self.grad_flat[self.offsets[p]:self.offsets[p] + p.numel()].view_as(p)
        self.grad_full = None         # sharded fp8 unit: the whole gradient, from backward to reduce
        self.arrived: set = set()     # parameters whose gradient this backward has produced
        self.in_backward = False      # gathered for backward: a recomputed forward must not free it

    # --- parameters -------------------------------------------------------------------------
    def gather(self) -> None:
        """optim_grads_params: refill flat from every rank's shard (one all-gather per unit)."""
        if self.sharded_params and not self.gathered:
            self._all_gather()

    @traced(args=lambda self: {"unit": self.name, "numel": self.flat.numel()})
    def _all_gather(self) -> None:
        self.flat.untyped_storage().resize_(self.flat.numel() * self.flat.element_size())
        torch.distributed.all_gather_into_tensor(_wire(self.flat), _wire(self.shard), group=self.group)
        self.gathered = True

    def free(self) -> None:
        """optim_grads_params: give back the gathered bytes; shapes (and saved views) stay."""
        if self.sharded_params and self.gathered:
            self.flat.untyped_storage().resize_(0)
            self.gathered = False

    def sync_params_after_step(self) -> None:
        """optim / optim_grads: every rank stepped its shard of flat; all-gather the rest.
        (no_shard stepped all of it; optim_grads_params gathers at the next forward.)"""
        if self.strategy in ("optim", "optim_grads"):
            mine = self.shard.clone()   # the collective's input must not alias its output
            torch.distributed.all_gather_into_tensor(_wire(self.flat), _wire(mine), group=self.group)

    # --- gradients ------------------------------------------------------------------------------
    def open_main_grads(self) -> None:
        """Sharded fp8 unit, its backward about to run: whole main_grad views for the fp8
        linears to add into (zeros: each micro-batch's sum is reduce-scattered on its own)."""
        if self.fp8 and self.sharded_grads and self.grad_full is None:
            self.grad_full = torch.zeros(self.flat.numel(), dtype=self.grad_dtype, device=self.flat.device)
            for p in self.params:
                p.main_grad = self.grad_full[self.offsets[p]:self.offsets[p] + p.numel()].view_as(p)

    def grad_ready(self, param) -> None:
        """A parameter's gradient for this backward is in .grad (post-accumulate hook); an fp8
        weight's .grad is a placeholder, its gradient already in main_grad (fp8/linear.py)."""
        if self.fp8:
            param.grad = None
            if not self.sharded_grads:
                return
        if not self.sharded_grads:
            # Whole gradients: add into the buffer now, reduce once per step (finish_grad_sync).
            offset = self.offsets[param]
            self.grad_flat[offset:offset + param.numel()].add_(param.grad.reshape(-1))
            param.grad = None
            return
        self.arrived.add(param)
        if len(self.arrived) == len(self.params):
            self.reduce_scatter_grads()

    @traced(args=lambda self: {"unit": self.name, "numel": self.flat.numel()})
    def reduce_scatter_grads(self) -> None:
        """optim_grads and up: this micro-batch's gradients, summed over dp, land in each rank's
        shard; the whole gradient exists only for the length of the collective."""
        if self.fp8:   # the linears added into grad_full already (open_main_grads)
            self.open_main_grads()   # (unless no backward reached the unit: zeros)
            full, self.grad_full = self.grad_full, None
            for p in self.params:
                del p.main_grad
        else:
            full = torch.zeros(self.flat.numel(), dtype=self.grad_dtype, device=self.flat.device)
            for p in self.arrived:
                offset = self.offsets[p]
                full[offset:offset + p.numel()].copy_(p.grad.reshape(-1))
                p.grad = None
        full.mul_(self.gradient_scaling_factor)
        full = full.to(self.comm_dtype)
        mine = torch.empty(self.shard_size, dtype=self.comm_dtype, device=full.device)
        torch.distributed.reduce_scatter_tensor(mine, full, group=self.group)
        self.grad_shard.add_(mine)   # micro-batches of one step add up in the shard
        self.arrived.clear()
        self.in_backward = False
        self.free()

    def finish_grad_sync(self) -> None:
        """After the last micro-batch: reduce what is still whole."""
        if self.sharded_grads:
            if self.arrived:   # some parameters got no gradient in the last backward (unused)
                self.reduce_scatter_grads()
            return
        self.grad_flat.mul_(self.gradient_scaling_factor)
        sent = self.grad_flat.to(self.comm_dtype)   # the buffer itself when the dtypes agree
        if self.strategy == "no_shard":
            torch.distributed.all_reduce(sent, group=self.group)
            if sent is not self.grad_flat:
                self.grad_flat.copy_(sent)
        else:   # optim: only my shard of the sum is read by the step
            mine = torch.empty(self.shard_size, dtype=self.comm_dtype, device=sent.device)
            torch.distributed.reduce_scatter_tensor(mine, sent, group=self.group)
            self.grad_shard.copy_(mine)

    def zero_grad(self) -> None:
        (self.grad_shard if self.sharded_grads else self.grad_flat).zero_()
        self.arrived.clear()

    # --- what the optimizer steps ---------------------------------------------------------------
    def piece(self, param):
        """(part of param.view(-1) this rank steps, its gradient) or None: views into shard and
        grad_shard. A shard boundary may cut a parameter, as in the distributed optimizer."""
        start = self.offsets[param]
        lo, hi = max(start, self.lo), min(start + param.numel(), self.hi)
        if lo >= hi:
            return None
        return self.shard[lo - self.lo:hi - self.lo], self.grad_shard[lo - self.lo:hi - self.lo]

    def bytes_held(self) -> dict:
        """What this unit holds now, in bytes (the estimate is checked against it)."""
        params = (self.shard.numel() + (self.flat.numel() if self.gathered else 0)) if self.sharded_params \
            else self.flat.numel()
        grads = self.grad_shard if self.sharded_grads else self.grad_flat
        return {"params": params * self.flat.element_size(), "grads": grads.numel() * grads.element_size()}
