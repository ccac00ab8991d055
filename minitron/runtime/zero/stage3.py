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
from minitron.runtime.swap_tensor.pipelined_optimizer_swapper import PipelinedOptimizerSwapper
from minitron.runtime.zero.leaf_modules import set_leaf_modules
from minitron.runtime.zero.offload import ZeroOffload
from minitron.runtime.zero.param_swap import PartitionedParamSwapping
from minitron.runtime.zero.parameter_offload import (  # noqa: F401 -- register_external_parameter re-exported
    AVAILABLE, NOT_AVAILABLE, DeepSpeedZeRoOffload, register_external_parameter,
)
from minitron.runtime.zero.utils import assert_ints_same_as_other_ranks
from minitron.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
from minitron.runtime.zero.zeropp import ZeroPlusPlus
from minitron.runtime.zero.stage3_config import Stage3Config
from minitron.runtime.zero.sub_groups import sub_group_bounds
from minitron.trace import traced


class DeepSpeedZeroOptimizer_Stage3(PartitionedParamSwapping, DeepSpeedZeRoOffload, DeepSpeedZeroOptimizer):
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
        self._group_of: dict = {}   # param -> (sub-group index, offset of its piece in my flat partition)
        # sub_group_size: each param group's parameters cut into sub-groups, each its own master,
        # stepped (and swapped) one after another (DeepSpeed's fp16_groups are these sub-groups)
        sub_group_size = (zero_config.stage3 if zero_config is not None else Stage3Config()).sub_group_size
        self.sub_group_to_group_id: list = []
        for g, group in enumerate(init_optimizer.param_groups):
            params = [p for p in group["params"] if p.requires_grad]
            for p in params:
                p.ds_numel, p.ds_shape, p.ds_id = p.numel(), p.shape, ds_ids.get(p, -1)
            # the torch optimizer's group g holds its sub-groups' masters (DeepSpeed's
            # _set_fp32_optimizer_param_groups, as a checkpoint's state dict lists them)
            pieces = [-(-p.numel() // self.dp_world_size) for p in params]   # DeepSpeed's partition_numel
            group["params"] = [self._partition_sub_group(params[a:b], g)
                               for a, b in sub_group_bounds(pieces, sub_group_size)]
        self._nvme(offload_optimizer, aio)
        self._nvme_params(offload_param, aio, dist.get_rank())   # param_swap.py: pieces to files
        for p in self._group_of:
            p.ds_status = AVAILABLE
            p.register_post_accumulate_grad_hook(weakly_bound(self._reduce_partition_and_release))
        self._configure_knobs(module, zero_config)
        self.release(list(self._group_of))   # the persistent too: gathered at their first use
        self._install_hooks(module)   # parameter_offload.py

    def _partition_sub_group(self, params: list, g: int) -> torch.Tensor:
        """My pieces of ``params`` end to end (the flat partition) and their fp32 master."""
        dp, r, s = self.dp_world_size, self.partition_id, len(self.fp16_groups)
        self.fp16_groups.append(params)
        self.sub_group_to_group_id.append(g)
        pieces = []
        for p in params:
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
            self._group_of[p] = (s, offset)
            offset += piece.numel()
        master = flat.detach().float()
        master = self.offload.host_tensor(master) if self.offload.optimizer else master.to(self.device, copy=True)
        master.requires_grad_(True)
        master.ds_id = f"{params[0].ds_id}_{params[-1].ds_id}" if params else "empty"   # its swap files' name
        self.single_partition_of_fp32_groups.append(master)
        self.norm_mask.append(torch.cat([self._counted(p).expand(piece.numel()) for p, piece in zip(params, pieces)]
                                        or [torch.zeros(0, dtype=torch.float64, device=self.device)]))
        return master

    def _configure_knobs(self, module, zero_config) -> None:
        """Stage 3's knobs (persistence, prefetch, reuse: partitioned_param_coordinator.py) and
        ZeRO++ (zeropp.py; qgZ, runtime/comm/coalesced_collectives.py)."""
        z = zero_config.stage3 if zero_config is not None else Stage3Config()
        mark_persistent_parameters(module, self._group_of, z.param_persistence_threshold, z.model_persistence_threshold)
        # leaf_module, stage3_module_granularity_threshold: modules gathered whole (leaf_modules.py)
        self.leaf_modules = set_leaf_modules(module, z.leaf_module, z.module_granularity_threshold)
        self.coordinator = PartitionedParameterCoordinator(z.prefetch_bucket_size, z.max_live_parameters,
                                                           z.max_reuse_distance)
        self.zeropp = ZeroPlusPlus(self.dp_process_group, z.zero_hpz_partition_size, z.zero_quantized_weights)
        self.zeropp.check(list(self._group_of))
        self.qgz = qgz_groups(self.dp_world_size) if z.zero_quantized_gradients else None
        self.allgather_sequential, self.all_reduce_fetch = z.allgather_sequential, z.use_all_reduce_for_fetch_params
        self.enable_sanity_checks = z.enable_sanity_checks
        self.coordinator.log_trace_cache_warnings = z.log_trace_cache_warnings

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
        padded = self.gradient_reduction.for_param(p).to_wire(padded)   # torch_autocast: p's own wire dtype
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
            pieces = [p.ds_tensor for p in self.fp16_groups[i]]   # (their sizes: a swapped one is meta)
            self.averaged_gradients[i] = torch.zeros(sum(t.numel() for t in pieces), dtype=pieces[0].dtype,
                                                     device=self.device)
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

    # --- the step, sub-group by sub-group ---------------------------------------------------

    @torch.no_grad()
    def step(self) -> None:
        """DeepSpeed's stage-3 step: the overflow check and the norm over every sub-group, then
        each sub-group in turn: its states in from their files (ZeRO-Infinity), its gradient
        unscaled and clipped, the optimizer stepped on it alone, its pieces updated, its states
        back out. Swapping, one sub-group's states are all a rank holds of them at a time."""
        prepared = self._prepare_step()
        if prepared is None:
            return
        masters, swapped = self.single_partition_of_fp32_groups, sorted(self.swapped)
        for s, master in enumerate(masters):
            ahead = next((k for k in swapped if k > s), None)   # the next swapped sub-group
            if s in self.swapped:   # pipeline_read starts reading ``ahead`` once mine are in
                self.swapper.swap_in_optimizer_state(master, s, None if ahead is None else (masters[ahead], ahead))
            self._set_grad(s, master, *prepared)
            self._optimizer_step(s)
            master.grad = None
            self._publish(s)
            if s in self.swapped:   # pipeline_write leaves the write in flight while another follows
                self.swapper.swap_out_optimizer_state(master, s, async_swap=ahead is not None)
        self.zero_grad()

    def _optimizer_step(self, s: int) -> None:
        """The torch optimizer's step on sub-group s's master alone (DeepSpeed's _optimizer_step)."""
        group = self.optimizer.param_groups[self.sub_group_to_group_id[s]]
        params, group["params"] = group["params"], [self.single_partition_of_fp32_groups[s]]
        try:
            self.optimizer.step()
        finally:
            group["params"] = params

    # --- the step's last move, bytes, full parameters ---------------------------------------

    def _publish(self, i: int) -> None:
        # My pieces take the update; nobody gathers now: the next forward does, module by module.
        if self.fp16_partitioned_groups_flat[i] is None:   # offload_param nvme: files and loose pieces
            self._publish_swapped(i)
        else:
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
        return sum(f.numel() * f.element_size() for f in self.fp16_partitioned_groups_flat if f is not None) + \
            self._loose_pieces_bytes()

    def host_bytes_held(self) -> dict:
        return {**super().host_bytes_held(), "params": self._pieces_bytes() if self.offload.param else 0}

    def _nvme(self, offload_optimizer, aio) -> None:
        """ZeRO-Infinity: each sub-group's master big enough to pay for the I/O goes to its files
        now and comes back for its step (swap_tensor/; pipelined with pipeline_read/write)."""
        self.swapper, self.swapped = None, set()
        if offload_optimizer is None or offload_optimizer.device != "nvme":
            return
        pipelined = offload_optimizer.pipeline_read or offload_optimizer.pipeline_write
        swapper = PipelinedOptimizerSwapper if pipelined else PartitionedOptimizerSwapper
        self.swapper = swapper(offload_optimizer, aio or AioConfig(), self.optimizer, dist.get_rank())
        for i, master in enumerate(self.single_partition_of_fp32_groups):
            if self.swapper.swappable(master.numel(), master.element_size()):
                self.swapped.add(i)
                self.swapper.swap_out_optimizer_state(master, i)
