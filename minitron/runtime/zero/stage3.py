"""ZeRO stage 3: parameters partitioned too (DeepSpeed's ``zero/stage3.py`` and
``partition_parameters.py``, in small).

Each parameter is cut on its own, as DeepSpeed's ``_partition_param`` cuts it: padded to a multiple
of dp, split into dp equal pieces, rank r keeping piece r (``param.ds_tensor``). The full tensor
exists only while a module needs it:

    forward    pre-hook  gather the module's own parameters (all-gather of the pieces)
               post-hook release them (param.data becomes an empty tensor), and wrap the
                         module's outputs in a function whose *backward* gathers them again
    backward   that function runs before the module's backward nodes (it sits after them in
               the forward graph) and gathers; each parameter's post-accumulate-grad hook
               then reduce-scatters its gradient into the owner's piece and releases it

So a rank holds P/dp parameters, P/dp gradients and P/dp optimizer states between steps, plus,
at any moment, the full parameters of the modules being run. Releasing means dropping the
parameter's reference to the gathered buffer; an autograd node that saved a *view* of a weight
(torch's ``F.linear`` saves ``weight.t()``) keeps that buffer alive until backward frees it,
which is why DeepSpeed swaps ``F.linear`` for its own autograd function that saves the parameter
itself. minitron's tensor-parallel linears already do: Megatron's
LinearWithGradAccumulationAndAsyncCommunication (core/tensor_parallel/layers.py) saves the
weight parameter, so a released weight's buffer goes at once and backward reads the re-gathered
one.

The optimizer side is stage 2's: the fp32 master is my pieces, end to end; the step is the
same, except that the updated pieces are *not* all-gathered (the next forward gathers them).
A parameter used by a module that does not own it — the GPT's output layer reading the
embedding's matrix when the two are tied — must be registered with that module
(``register_external_parameter``, DeepSpeed's name): its hooks then gather and release it too.
Unregistered, the module would find an empty tensor; DeepSpeed detects some of these cases by
itself, minitron only the registered ones.
"""

from __future__ import annotations

import torch

from minitron import comm as dist   # as DeepSpeed's ZeRO: from deepspeed import comm as dist
from minitron.accelerator import get_accelerator
from minitron.runtime.comm.coalesced_collectives import all_to_all_quant_reduce, qgz_applies, qgz_groups
from minitron.runtime.gradient_reduction import GradientReduction
from minitron.runtime.zero.buckets import weakly_bound
from minitron.runtime.zero.partitioned_param_coordinator import (
    PartitionedParameterCoordinator, mark_persistent_parameters,
)
from minitron.runtime.swap_tensor.aio_config import AioConfig
from minitron.runtime.swap_tensor.optimizer_swapper import PartitionedOptimizerSwapper
from minitron.runtime.zero.offload import ZeroOffload
from minitron.runtime.zero.partition_parameters import fetch
from minitron.runtime.zero.utils import assert_ints_same_as_other_ranks
from minitron.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from minitron.runtime.zero.zeropp import ZeroPlusPlus
from minitron.trace import traced

AVAILABLE, NOT_AVAILABLE = "AVAILABLE", "NOT_AVAILABLE"   # DeepSpeed's ZeroParamStatus


def register_external_parameter(module: torch.nn.Module, parameter: torch.nn.Parameter) -> None:
    """``deepspeed.zero.register_external_parameter``: ``module`` uses ``parameter``, owned
    elsewhere, in its forward. Call it before ``initialize()``; stage 3 then gathers the
    parameter for ``module``'s forward and backward as it gathers the module's own."""
    external = module.__dict__.setdefault("ds_external_parameters", [])
    if not any(p is parameter for p in external):
        external.append(parameter)


def _params_of(module: torch.nn.Module) -> list:
    """What a module's forward needs gathered: its own parameters and the registered ones."""
    return list(module.parameters(recurse=False)) + list(getattr(module, "ds_external_parameters", []))


class _GatherBeforeBackward(torch.autograd.Function):
    """Identity in forward; in backward, gathers the module's parameters first."""

    @staticmethod
    def forward(ctx, optimizer, module, *outputs):
        ctx.optimizer, ctx.module = optimizer, module
        return tuple(t.view_as(t) for t in outputs)

    @staticmethod
    def backward(ctx, *grads):
        ctx.optimizer._fetch(ctx.module)
        return (None, None, *grads)


class DeepSpeedZeroOptimizer_Stage3(DeepSpeedZeroOptimizer):
    def __init__(self, module: torch.nn.Module, init_optimizer: torch.optim.Optimizer, dp_process_group,
                 loss_scaler, clip_grad: float = 0.0, model_parallel_group=None, overlap_comm: bool = True,
                 offload_optimizer=None, offload_param=None, aio=None, zero_config=None):
        self.optimizer = init_optimizer
        self._init_model_parallel(model_parallel_group)
        self.dp_process_group = dp_process_group
        self.dp_world_size = dist.get_world_size(group=dp_process_group)
        # Divide by dp, then sum (reduce_scatter_coalesced); the engine sets the config's dtype.
        self.gradient_reduction = GradientReduction(self.dp_world_size)
        self.stage, self.partition_gradients = 3, True
        self.partition_count = self.dp_world_size
        self.partition_id = dist.get_rank(group=dp_process_group)
        self.loss_scaler, self.clip_grad = loss_scaler, clip_grad
        self.device = torch.device(get_accelerator().current_device_name())   # see stage_1_and_2.py
        # offload_optimizer / offload_param: what lives on the host (zero/offload.py)
        self.offload = ZeroOffload(offload_optimizer, offload_param, self.device)
        # DeepSpeed's ds_id: the parameter's place in the module (its swap files are named by them)
        ds_ids = {p: k for k, p in enumerate(module.parameters())}
        self.overflow, self._global_grad_norm = False, None
        self.fp16_groups, self.fp16_partitioned_groups_flat, self.single_partition_of_fp32_groups = [], [], []
        self.averaged_gradients: dict = {}
        # overlap_comm (DeepSpeed's default at stage 3): each reduce-scatter is launched and left
        # in flight while backward goes on; reduce_gradients waits for them all.
        self.overlap_comm, self.in_flight = overlap_comm, []
        self._group_of: dict = {}   # param -> (group index, offset of its piece in my flat partition)
        dp, r = self.dp_world_size, self.partition_id
        for i, group in enumerate(init_optimizer.param_groups):
            params = [p for p in group["params"] if p.requires_grad]
            self.fp16_groups.append(params)
            pieces = []
            for p in params:
                p.ds_numel, p.ds_shape, p.ds_id = p.numel(), p.shape, ds_ids.get(p, -1)
                piece = -(-p.numel() // dp)            # ceil: the last rank's piece holds the padding
                padded = p.new_zeros(piece * dp)   # on p's device: the engine has moved the module
                padded[:p.numel()].copy_(p.detach().reshape(-1))
                pieces.append(padded[r * piece:(r + 1) * piece])
            flat = torch.cat(pieces) if pieces else torch.zeros(0, device=self.device)
            flat = self.offload.host_tensor(flat) if self.offload.param else flat
            self.fp16_partitioned_groups_flat.append(flat)
            offset = 0
            for p, piece in zip(params, pieces):
                p.ds_tensor = flat[offset:offset + piece.numel()]   # my piece, a view into my flat
                self._group_of[p] = (i, offset)
                offset += piece.numel()
            master = flat.detach().float()
            master = self.offload.host_tensor(master) if self.offload.optimizer else master.to(self.device, copy=True)
            master.requires_grad_(True)
            master.ds_id = f"{params[0].ds_id}_{params[-1].ds_id}" if params else "empty"
            self.single_partition_of_fp32_groups.append(master)
            self.norm_mask.append(torch.cat([self._counted(p).expand(piece.numel())
                                             for p, piece in zip(params, pieces)]
                                            or [torch.zeros(0, dtype=torch.float64, device=self.device)]))
            group["params"] = [master]
        self._nvme(offload_optimizer, aio)
        for p in self._group_of:
            p.ds_status = AVAILABLE
            p.register_post_accumulate_grad_hook(weakly_bound(self._reduce_partition_and_release))
        self._configure_knobs(module, zero_config)
        self.release(list(self._group_of))   # the persistent too: gathered at their first use
        self._hooks = [module.register_forward_pre_hook(lambda *_: self.coordinator.reset_step())]
        # Every module, as DeepSpeed hooks every one: one without parameters gathers nothing, but
        # its forward and backward are steps of the coordinator's trace all the same.
        for k, m in enumerate(module.modules()):
            m.ds_id = k   # DeepSpeed numbers the modules too: the coordinator's warnings name them by it
            self._hooks += [m.register_forward_pre_hook(self._pre_forward), m.register_forward_hook(self._post_forward)]

    def _configure_knobs(self, module, zero_config) -> None:
        """Stage 3's knobs (persistence, prefetch, reuse: partitioned_param_coordinator.py) and
        ZeRO++ (zeropp.py; qgZ, runtime/comm/coalesced_collectives.py)."""
        from minitron.runtime.zero.stage3_config import Stage3Config   # DeepSpeed's defaults
        z = zero_config.stage3 if zero_config is not None else Stage3Config()
        mark_persistent_parameters(module, self._group_of, z.param_persistence_threshold, z.model_persistence_threshold)
        self.coordinator = PartitionedParameterCoordinator(z.prefetch_bucket_size, z.max_live_parameters,
                                                           z.max_reuse_distance)
        self.zeropp = ZeroPlusPlus(self.dp_process_group, z.zero_hpz_partition_size, z.zero_quantized_weights)
        self.zeropp.check(list(self._group_of))
        self.qgz = qgz_groups(self.dp_world_size) if z.zero_quantized_gradients else None
        self.allgather_sequential, self.all_reduce_fetch = z.allgather_sequential, z.use_all_reduce_for_fetch_params
        self.enable_sanity_checks = z.enable_sanity_checks
        self.coordinator.log_trace_cache_warnings = z.log_trace_cache_warnings

    # --- gather and release ---------------------------------------------------------------

    @torch.no_grad()
    def gather(self, params: list) -> None:
        """One all-gather for all of a module's missing parameters, as DeepSpeed coalesces them:
        my pieces end to end go out, every rank's come back as the rows of ``full``, and
        parameter p is its column range of the rows, read row after row."""
        todo = list({id(p): p for p in params if p in self._group_of and p.ds_status != AVAILABLE}.values())
        for dtype in dict.fromkeys(p.ds_tensor.dtype for p in todo):   # one dtype per collective
            # partition_parameters.py: coalesced (zeropp.py: hpZ's secondary pieces, qwZ's int8),
            # one by one, or one all-reduce, as the config asks; host -> device first, offloaded
            fetch([p for p in todo if p.ds_tensor.dtype == dtype], self.zeropp,
                  lambda mine: self.offload.fetch(mine, None), self.allgather_sequential, self.all_reduce_fetch)

    def release(self, params: list) -> None:
        for p in params:
            if p in self._group_of:
                if p.ds_status == AVAILABLE:
                    self.zeropp.keep_secondary(p)   # hpZ: my 1/h of the whole, for the next gathers
                p.data = p.ds_tensor.new_empty(0)   # on the device the parameter lives on
                p.ds_status = NOT_AVAILABLE

    def _fetch(self, module) -> None:
        available = lambda: sum(p.ds_numel for p in self._group_of if p.ds_status == AVAILABLE)   # noqa: E731
        own = [p for p in _params_of(module) if p in self._group_of]
        self.coordinator.fetch_sub_module(module, own, self.gather, available)

    def _pre_forward(self, module, inputs):
        self._fetch(module)

    def _post_forward(self, module, inputs, output):
        # Wrap first, release second: a module may hand back one of its own parameters (a
        # linear with skip_bias_add returns its bias, added by the caller); the wrapper's view
        # of it keeps the gathered values that the caller still adds.
        output = self._wrap_outputs(module, output)
        self.release(self.coordinator.params_to_release(_params_of(module)))
        return output

    def _wrap_outputs(self, module, output):
        single = torch.is_tensor(output)
        items = [output] if single else list(output) if isinstance(output, (tuple, list)) else None
        if items is None:
            return output
        if torch.is_grad_enabled():
            slots = [k for k, t in enumerate(items) if torch.is_tensor(t) and t.requires_grad]
            if not slots:
                return output
            wrapped = _GatherBeforeBackward.apply(self, module, *(items[k] for k in slots))
            for k, t in zip(slots, wrapped):
                items[k] = t
        else:   # no backward to prepare for; a returned parameter still needs its values kept
            own = _params_of(module)
            items = [t.view_as(t) if any(t is p for p in own) else t for t in items]
        if single:
            return items[0]
        return type(output)(*items) if hasattr(output, "_fields") else type(output)(items)   # namedtuple

    # --- gradients ------------------------------------------------------------------------

    @torch.no_grad()
    def _reduce_partition_and_release(self, p: torch.Tensor) -> None:
        """p's gradient is complete for this micro-batch: sum it over the ranks, keep my piece
        (averaged), accumulate it into my gradient partition, drop the full gradient and p."""
        i, offset = self._group_of[p]
        piece = p.ds_tensor.numel()
        if self.enable_sanity_checks:   # do the ranks reduce the same parameter now? (zero/utils.py)
            assert_ints_same_as_other_ranks([p.ds_id])
        if self.qgz is not None and qgz_applies(tuple(p.grad.shape), self.dp_world_size):
            # qgZ: int4 all-to-alls, synchronous; what comes back is my partition already summed
            # over the ranks and divided by the number of nodes (coalesced_collectives.py)
            wire = p.grad if self.gradient_reduction.dtype is None else p.grad.to(self.gradient_reduction.dtype)
            self._add(i, offset, all_to_all_quant_reduce(wire, **self.qgz))
            p.grad = None
            self.release(self.coordinator.params_to_release([p]))
            return
        padded = p.grad.new_zeros(piece * self.dp_world_size)
        padded[:p.ds_numel].copy_(p.grad.reshape(-1))
        padded = self.gradient_reduction.to_wire(padded)
        mine = padded.new_empty(piece)
        handle = dist.reduce_scatter_tensor(mine, padded, group=self.dp_process_group, async_op=self.overlap_comm)
        if self.overlap_comm:
            self.in_flight.append((i, offset, mine, handle))
        else:
            self._add(i, offset, mine)
        p.grad = None
        self.release(self.coordinator.params_to_release([p]))

    def _add(self, i: int, offset: int, mine: torch.Tensor) -> None:
        if i not in self.averaged_gradients:   # on the device, even when the pieces live on the host
            flat = self.fp16_partitioned_groups_flat[i]
            self.averaged_gradients[i] = torch.zeros(flat.shape, dtype=flat.dtype, device=self.device)
        mean = self.gradient_reduction.from_wire(mine, self.averaged_gradients[i].dtype)   # divided before the sum
        self.averaged_gradients[i][offset:offset + mine.numel()].add_(mean)

    @traced(args=lambda self, *a: {"in_flight": len(self.in_flight)})
    def reduce_gradients(self, is_gradient_accumulation_boundary: bool) -> None:
        """The hooks above reduced parameter by parameter, in backward; with overlap_comm, wait
        for those still in flight (DeepSpeed's independent_gradient_partition_epilogue)."""
        for i, offset, mine, handle in self.in_flight:
            handle.wait()
            self._add(i, offset, mine)
        self.in_flight = []

    # --- the step's last move, bytes, full parameters ---------------------------------------

    def _publish(self, i: int) -> None:
        # My pieces take the update; nobody gathers now: the next forward does, module by module.
        self.offload.publish(self.single_partition_of_fp32_groups[i], self.fp16_partitioned_groups_flat[i], i,
                             dest_on_host=self.offload.param)
        # ... but for the persistent parameters, kept whole, so gathered now (DeepSpeed's _post_step);
        # hpZ's secondary pieces hold the old weights and go.
        self.zeropp.invalidate_secondary(self.fp16_groups[i])
        for p in self.fp16_groups[i]:
            if p.ds_persist:   # one all-gather each, as DeepSpeed's all_gather of the list makes them
                p.ds_status = NOT_AVAILABLE
                self.gather([p])

    def zero_grad(self) -> None:
        self.averaged_gradients = {}

    def bytes_held(self) -> dict:
        gathered = sum(p.numel() * p.element_size() for p in self._group_of)   # between steps: the persistent
        secondary = sum(p.ds_secondary_tensor.numel() * p.ds_secondary_tensor.element_size()   # hpZ's
                        for p in self._group_of if getattr(p, "ds_secondary_tensor", None) is not None)
        params = gathered + secondary + (0 if self.offload.param else self._pieces_bytes())
        grads = sum(g.numel() * g.element_size() for g in self.averaged_gradients.values())
        return {"params": params, "grads": grads, "optimizer_states": self._optimizer_state_bytes()}

    def _pieces_bytes(self) -> int:
        return sum(f.numel() * f.element_size() for f in self.fp16_partitioned_groups_flat)

    def host_bytes_held(self) -> dict:
        return {**super().host_bytes_held(), "params": self._pieces_bytes() if self.offload.param else 0}

    def _nvme(self, offload_optimizer, aio) -> None:
        """ZeRO-Infinity: each group's master big enough to pay for the I/O goes to its files now
        and comes back for each step (swap_tensor/optimizer_swapper.py)."""
        self.swapper, self.swapped = None, set()
        if offload_optimizer is None or offload_optimizer.device != "nvme":
            return
        self.swapper = PartitionedOptimizerSwapper(offload_optimizer, aio or AioConfig(), self.optimizer,
                                                   dist.get_rank())
        for i, master in enumerate(self.single_partition_of_fp32_groups):
            if self.swapper.swappable(master.numel(), master.element_size()):
                self.swapped.add(i)
                self.swapper.swap_out_optimizer_state(master, i)
